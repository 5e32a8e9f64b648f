"""cluster/aws.yaml's security group, through Ray's own AWS bootstrap against moto.

Before `ray up` launches anything it resolves the cluster file (Ray 2.60
``commands.create_or_update_cluster`` -> ``_bootstrap_config``: ``prepare_config``,
``validate_config``, then the AWS provider's ``bootstrap_aws``: instance profile, key pair,
subnets, security group, AMI). These tests run that same function on the real
cluster/aws.yaml against moto's in-process EC2 (fake credentials, no network), after
replaying the aws-cli commands of docs/cluster.md's step 5 (the security group) and doing
its step 8 (the group's id into the file), and read the groups back with boto3. Nothing is
stubbed: moto answers every call the bootstrap makes (instance types, key pairs, subnets,
security groups; the file's instance profiles mean no IAM call).

The cases with a ``provider.security_group`` section show why the file names the group by
id instead: Ray opens SSH to 0.0.0.0/0 in a named group it creates or finds empty, and
applies none of the section's rules to a named group that has rules.

Private dependencies of Ray (no public function resolves a cluster file), pinned with their
reasons in test_private_reliance.py: ``ray.autoscaler._private.commands._bootstrap_config``,
and the ``cache_clear`` of the lru_caches in which Ray's AWS code keeps boto3 clients and
subnet look-ups (``aws.utils.resource_cache``, ``aws.utils.client_cache``,
``aws.config._get_subnets_or_die``), emptied so that no test reuses another's.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import yaml

moto = pytest.importorskip("moto", reason="moto (the dev extra) mocks EC2 for these tests")

import boto3  # noqa: E402  (after the skip: boto3 comes with moto)
import jmespath  # noqa: E402  (botocore's dependency: evaluates the docs' --query)

REPO = Path(__file__).resolve().parents[2]
AWS = REPO / "cluster" / "aws.yaml"
DOCS = REPO / "docs" / "cluster.md"
REGION = "us-west-2"
PLACEHOLDER = "sg-REPLACE-WITH-YOUR-GROUP-ID"
GROUP_NAME = "raypeft-cluster"
FILE_CIDR = "203.0.113.7/32"  # the SSH rule the file's old `security_group` section had
ANYWHERE = "0.0.0.0/0"


def forget_ray_clients() -> None:
    """Ray's AWS code caches boto3 resources and subnet look-ups for the process."""
    from ray.autoscaler._private.aws import config, utils

    for cached in (utils.resource_cache, utils.client_cache, config._get_subnets_or_die):
        cached.cache_clear()


@pytest.fixture
def ec2(tmp_path, monkeypatch):
    """moto's EC2 for one test, with fake credentials and a temporary home (the launcher
    writes its key pair's private key to ~/.ssh)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "HOME": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    forget_ray_clients()
    with moto.mock_aws():
        yield boto3.client("ec2", region_name=REGION)
    forget_ray_clients()


# ------------------------------------------------------------------ the documented procedure


def step5_commands() -> list[str]:
    """The shell lines of docs/cluster.md's step 5, continuations joined."""
    step = re.search(r"^5\. \*\*.*?(?=^6\. \*\*)", DOCS.read_text(), re.M | re.S)
    assert step, "docs/cluster.md: no step 5"
    block = re.search(r"```bash\n(.*?)```", step.group(0), re.S)
    assert block, "docs/cluster.md: step 5 has no bash block"
    lines = re.sub(r"\\\n\s*", " ", block.group(1)).splitlines()
    return [line.strip() for line in lines if line.strip()]


def shorthand_filter(value: str) -> dict:
    """The AWS CLI's shorthand `Name=is-default,Values=true`."""
    fields = dict(part.split("=", 1) for part in value.split(","))
    return {"Name": fields["Name"], "Values": [fields["Values"]]}


def ingress_permission(options: dict) -> dict:
    """What the AWS CLI makes of authorize-security-group-ingress's shorthand options
    (--protocol, --port, --cidr, --source-group: awscli's ec2 secgroupsimplify)."""
    protocol = options.pop("--protocol")
    permission = {"IpProtocol": "-1" if protocol == "all" else protocol}
    if "--port" in options:
        low, _, high = options.pop("--port").partition("-")
        permission |= {"FromPort": int(low), "ToPort": int(high or low)}
    if "--cidr" in options:
        permission["IpRanges"] = [{"CidrIp": options.pop("--cidr")}]
    if "--source-group" in options:
        permission["UserIdGroupPairs"] = [{"GroupId": options.pop("--source-group")}]
    return permission


def describe_vpcs(ec2, options: dict) -> dict:
    return ec2.describe_vpcs(Filters=[shorthand_filter(options.pop("--filters"))])


def create_security_group(ec2, options: dict) -> dict:
    return ec2.create_security_group(
        VpcId=options.pop("--vpc-id"),
        GroupName=options.pop("--group-name"),
        Description=options.pop("--description"),
    )


def authorize_security_group_ingress(ec2, options: dict) -> dict:
    permission = ingress_permission(options)
    return ec2.authorize_security_group_ingress(
        GroupId=options.pop("--group-id"), IpPermissions=[permission]
    )


# each takes the options it knows out of the dict: what is left was not replayed
OPERATIONS = {
    "describe-vpcs": describe_vpcs,
    "create-security-group": create_security_group,
    "authorize-security-group-ingress": authorize_security_group_ingress,
}


def aws_cli(tokens: list[str], ec2) -> str | None:
    """One `aws ec2` command through boto3; an operation or option this replay does not know
    fails the test (the docs changed: replay the new procedure)."""
    assert tokens[:2] == ["aws", "ec2"] and tokens[2] in OPERATIONS, tokens
    options = dict(zip(tokens[3::2], tokens[4::2], strict=False))
    assert len(tokens) - 3 == 2 * len(options), f"an option without a value, or twice: {tokens}"
    assert options.pop("--region") == REGION
    query, output = options.pop("--query", None), options.pop("--output", None)
    response = OPERATIONS[tokens[2]](ec2, options)
    assert not options, f"options this replay ignores: {options}"
    assert output in (None, "text") and (query is None) == (output is None), tokens
    return jmespath.search(query, response) if query else None


def replay(lines: list[str], ec2) -> dict[str, str]:
    """The docs' shell lines, in order: assignments, `$(aws ...)`, `aws ...`, `echo`.
    Returns the shell variables they set ($REGION comes from step 3)."""
    env = {"REGION": REGION}
    for line in lines:
        line = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], line)
        assignment = re.match(r"^(\w+)=(.*)$", line)
        if assignment and assignment.group(2).startswith("$("):
            inner = re.fullmatch(r"\$\((.*)\)", assignment.group(2).strip())
            env[assignment.group(1)] = aws_cli(shlex.split(inner.group(1)), ec2)
        elif assignment:
            env[assignment.group(1)] = shlex.split(assignment.group(2), comments=True)[0]
        elif line.startswith("aws "):
            aws_cli(shlex.split(line, comments=True), ec2)
        else:
            assert line.startswith("echo "), f"the replay cannot run: {line}"
    return env


def aws_yaml(group_id: str) -> dict:
    """cluster/aws.yaml after step 8: the group's id in place of the placeholder."""
    text = AWS.read_text()
    assert text.count(PLACEHOLDER) == 1, "one anchor, which every node type refers to"
    return yaml.safe_load(text.replace(PLACEHOLDER, group_id))


def ray_up_resolves(config: dict) -> dict:
    """What `ray up` does to the file before it launches anything (no cache file in /tmp)."""
    from ray.autoscaler._private.commands import _bootstrap_config

    return _bootstrap_config(copy.deepcopy(config), no_config_cache=True)


def ingress(ec2, group_id: str) -> set[tuple]:
    """The group's inbound rules: (protocol, from port, to port, source), one per source."""
    group = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    rules = set()
    for permission in group["IpPermissions"]:
        ports = (permission["IpProtocol"], permission.get("FromPort"), permission.get("ToPort"))
        sources = [r["CidrIp"] for r in permission["IpRanges"]]
        sources += [r["CidrIpv6"] for r in permission["Ipv6Ranges"]]
        sources += [pair["GroupId"] for pair in permission["UserIdGroupPairs"]]
        sources += [prefix["PrefixListId"] for prefix in permission["PrefixListIds"]]
        rules |= {(*ports, source) for source in sources}
    return rules


def documented_rules(group_id: str, cidr: str) -> set[tuple]:
    """What docs/cluster.md promises: SSH from your address, everything between members."""
    return {("-1", None, None, group_id), ("tcp", 22, 22, cidr)}


def group_ids(ec2) -> set[str]:
    return {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}


def where(**fields: str) -> list[dict]:
    """EC2 filters, one value each: where(vpc_id="vpc-1") filters on `vpc-id`."""
    return [{"Name": name.replace("_", "-"), "Values": [value]} for name, value in fields.items()]


def node_subnets(ec2, resolved: dict) -> list[dict]:
    """The subnets `ray up` resolved for the node types, all of them together."""
    types = resolved["available_node_types"].values()
    ids = sorted({s for node_type in types for s in node_type["node_config"]["SubnetIds"]})
    return ec2.describe_subnets(SubnetIds=ids)["Subnets"]


@pytest.mark.slow
def test_the_documented_group_is_every_nodes_group_with_only_its_two_rules(ec2):
    """Steps 5 and 8 of docs/cluster.md, then what `ray up` resolves: every node type in
    that group, its subnets in the group's VPC, and the group's rules as step 5 made them."""
    env = replay(step5_commands(), ec2)
    assert env["MY_CIDR"].endswith("/32") and env["SG"].startswith("sg-")
    groups_before = group_ids(ec2)

    resolved = ray_up_resolves(aws_yaml(env["SG"]))

    assert ingress(ec2, env["SG"]) == documented_rules(env["SG"], env["MY_CIDR"])
    assert group_ids(ec2) == groups_before, "Ray created a group"
    zones = resolved["provider"]["availability_zone"].split(",")
    subnets = node_subnets(ec2, resolved)
    assert {s["VpcId"] for s in subnets} == {env["VPC"]}
    assert {s["AvailabilityZone"] for s in subnets} <= set(zones)
    for name, node_type in resolved["available_node_types"].items():
        assert node_type["node_config"]["SecurityGroupIds"] == [env["SG"]], name


@pytest.mark.slow
def test_an_id_left_as_shipped_stops_ray_up_without_making_a_group(ec2, capsys):
    """Skipping step 5 or 8 fails closed: no group is created, none is opened."""
    groups_before = group_ids(ec2)
    with pytest.raises(AssertionError):
        ray_up_resolves(yaml.safe_load(AWS.read_text()))
    # Ray's own message, printed by its cli_logger before the (empty) AssertionError
    assert "Failed to detect a security group with id" in capsys.readouterr().err
    assert group_ids(ec2) == groups_before


# -------------------------------------------------- a `security_group` section instead (why not)


def with_a_named_group(config: dict) -> dict:
    """The file as it was before (issue 39): no SecurityGroupIds, a section naming the group
    and its one SSH rule (another address than step 5's)."""
    config = copy.deepcopy(config)
    for node_type in config["available_node_types"].values():
        del node_type["node_config"]["SecurityGroupIds"]
    ssh = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": FILE_CIDR}]}
    config["provider"]["security_group"] = {"GroupName": GROUP_NAME, "IpPermissions": [ssh]}
    return config


def named_group(ec2) -> str:
    groups = ec2.describe_security_groups(Filters=where(group_name=GROUP_NAME))
    (group,) = groups["SecurityGroups"]
    return group["GroupId"]


@pytest.mark.parametrize("commands", ["none", "create-only"])
@pytest.mark.slow
def test_a_named_group_ray_creates_or_finds_empty_lets_ssh_in_from_anywhere(ec2, commands):
    """No group (Ray creates it), or step 5 without its rules: Ray adds the intra-group rule,
    SSH from 0.0.0.0/0 and the section's rule."""
    if commands == "create-only":
        lines = step5_commands()
        creation = next(i for i, line in enumerate(lines) if "create-security-group" in line)
        replay(lines[: creation + 1], ec2)

    ray_up_resolves(with_a_named_group(aws_yaml("sg-unused")))

    group = named_group(ec2)
    assert ingress(ec2, group) == documented_rules(group, FILE_CIDR) | {("tcp", 22, 22, ANYWHERE)}


@pytest.mark.slow
def test_a_named_group_that_has_rules_gets_none_of_the_sections_rules(ec2):
    """docs/cluster.md's procedure until this was tested: the group made with its rules by
    step 5, the file's section naming it. Ray uses it as it is: the section's SSH rule
    (another address) is never applied."""
    env = replay(step5_commands(), ec2)
    assert FILE_CIDR != env["MY_CIDR"]

    resolved = ray_up_resolves(with_a_named_group(aws_yaml(env["SG"])))

    assert named_group(ec2) == env["SG"]
    assert ingress(ec2, env["SG"]) == documented_rules(env["SG"], env["MY_CIDR"])
    for name, node_type in resolved["available_node_types"].items():
        assert node_type["node_config"]["SecurityGroupIds"] == [env["SG"]], name


@pytest.mark.slow
def test_the_groups_vpc_decides_where_the_nodes_go(ec2):
    """Another VPC whose public subnet comes first in the first zone: Ray looks a named group
    up there (and creates it, open to the world), whichever VPC step 5 used; the group's id
    keeps every node in the group's VPC."""
    env = replay(step5_commands(), ec2)
    other = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=other, CidrBlock="10.9.1.0/24", AvailabilityZone=f"{REGION}a")
    public = {"Value": True}
    ec2.modify_subnet_attribute(SubnetId=subnet["Subnet"]["SubnetId"], MapPublicIpOnLaunch=public)
    first_zone = where(vpc_id=env["VPC"], availability_zone=f"{REGION}a")
    for s in ec2.describe_subnets(Filters=first_zone)["Subnets"]:
        # not public, so not a candidate: the other VPC's subnet comes first, whatever order
        # EC2 lists subnets in (Ray takes the VPC of the first candidate of the first zone)
        ec2.modify_subnet_attribute(SubnetId=s["SubnetId"], MapPublicIpOnLaunch={"Value": False})

    by_id = ray_up_resolves(aws_yaml(env["SG"]))
    by_name = ray_up_resolves(with_a_named_group(aws_yaml(env["SG"])))

    assert {s["VpcId"] for s in node_subnets(ec2, by_id)} == {env["VPC"]}
    made = ec2.describe_security_groups(Filters=where(vpc_id=other, group_name=GROUP_NAME))
    made = made["SecurityGroups"]
    assert len(made) == 1
    assert ("tcp", 22, 22, ANYWHERE) in ingress(ec2, made[0]["GroupId"])
    head = by_name["available_node_types"][by_name["head_node_type"]]["node_config"]
    assert head["SecurityGroupIds"] == [made[0]["GroupId"]]
