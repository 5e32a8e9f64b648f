"""IPT (Jiang et al. 2022): instance-wise prompts from a per-token table or a small encoder.

``method`` holds the config, module, count and budget; ``pretrain`` the TextCNN pretraining of
the prompt table; ``text_encoders`` the trainable encoders; ``corpora`` the category-labelled
corpora they pretrain on.
"""

from raypeft.methods.ipt import method  # noqa: F401  (registers the method)
