"""The code of raypeft's ``python_function`` models (MLflow's models-from-code: this file is
copied into every logged model and run where it is loaded; nothing is pickled).

It only names the model class: the trained tensors, config and labels are the model's
``raypeft_model`` artefact, read by :meth:`RaypeftPyfunc.load_context`.
"""

from mlflow.models import set_model

from raypeft.serving.pyfunc import RaypeftPyfunc

set_model(RaypeftPyfunc())
