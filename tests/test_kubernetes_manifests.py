"""deploy/kubernetes/: every object is valid Kubernetes (strict schema), grants and
admits no more than the design says, and runs the master with flags it has.

No cluster here: these checks are what stands between a typo and a manifest that
`kubectl apply` rejects or, worse, accepts with a field silently dropped."""

import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest

import kubeschema

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
MANIFEST_FILES = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")

NAME = {"app.kubernetes.io/name": "antdt-tf"}
TASK_POD = {**NAME, "app.kubernetes.io/component": "task", "antdt.io/job": "j1",
            "antdt.io/role": "worker", "antdt.io/index": "0", "antdt.io/generation": "1"}
MASTER_POD = {**NAME, "app.kubernetes.io/component": "master"}
OTHER_POD = {"app.kubernetes.io/name": "something-else"}

# flags the Deployment may name before the master defines them (none: every argument is
# parsed by the master's own flags)
PENDING_MASTER_FLAGS: set = set()


def _objects():
    return [doc for path in MANIFEST_FILES for doc in kubeschema.load_manifests(path)]


def _one(kind, name):
    found = [o for o in _objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _of_kind(kind):
    return [o for o in _objects() if o["kind"] == kind]


def _master_container():
    pod = _one("Deployment", "antdt-master")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _args(container) -> dict:
    out = {}
    for arg in container["args"]:
        assert arg.startswith("--") and "=" in arg, f"expected --flag=value, got {arg!r}"
        name, value = arg[2:].split("=", 1)
        assert name not in out, f"--{name} given twice"
        out[name] = value
    return out


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.name)
def test_every_document_validates_strictly(path):
    docs = kubeschema.load_manifests(path)
    assert docs, f"{path.name} has no objects"
    for doc in docs:
        kubeschema.validate(doc)


def test_validate_rejects_a_bad_manifest():
    """The schema check can fail: an unknown container field, a wrong type, a bad kind."""
    deployment = _one("Deployment", "antdt-master")
    kubeschema.validate(deployment, kind_hint="Deployment")
    bad_field = copy.deepcopy(deployment)
    bad_field["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match=r"Deployment/antdt-master.*imagePullPolicyy"):
        kubeschema.validate(bad_field)
    bad_type = copy.deepcopy(deployment)
    bad_type["spec"]["replicas"] = "one"
    with pytest.raises(AssertionError, match="Deployment/antdt-master"):
        kubeschema.validate(bad_type)
    with pytest.raises(AssertionError, match="expected kind Service"):
        kubeschema.validate(deployment, kind_hint="Service")
    with pytest.raises(AssertionError, match="no schema"):
        kubeschema.validate({**deployment, "kind": "Deploymnet"})


def test_no_secret_is_committed():
    assert not _of_kind("Secret"), "Secrets are created with kubectl (README.md), never committed"


def test_kustomization_lists_every_manifest():
    (kustomization,) = kubeschema.load_manifests(DEPLOY / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFEST_FILES)
    namespaced = [o for o in _objects() if "namespace" in o["metadata"]]
    assert {o["metadata"]["namespace"] for o in namespaced} == {kustomization["namespace"]}


def test_master_role_grants_exactly_what_the_master_needs():
    role = _one("Role", "antdt-master")
    rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
                   for r in role["rules"])
    assert rules == sorted([
        (("",), ("pods",), tuple(sorted(["create", "get", "list", "watch", "delete", "patch"]))),
        (("",), ("pods/log",), ("get",)),
        (("",), ("services",), tuple(sorted(["create", "get", "list", "watch", "delete"]))),
        (("",), ("configmaps",), tuple(sorted(["create", "get", "list", "watch", "delete",
                                               "patch"]))),
    ])
    assert all(set(r) <= {"apiGroups", "resources", "verbs"} for r in role["rules"]), \
        "no resourceNames / nonResourceURLs tricks"
    assert [r["metadata"]["name"] for r in _of_kind("Role")] == ["antdt-master"]
    binding = _one("RoleBinding", "antdt-master")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "antdt-master"}
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
        ("ServiceAccount", "antdt-master")]


def test_cluster_roles_only_read_nodes():
    for cluster_role in _of_kind("ClusterRole"):
        assert "aggregationRule" not in cluster_role
        assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                          "verbs": ["get", "list", "watch"]}], \
            cluster_role["metadata"]["name"]
    for binding in _of_kind("ClusterRoleBinding"):
        assert binding["roleRef"]["kind"] == "ClusterRole"
        _one("ClusterRole", binding["roleRef"]["name"])   # ours, not e.g. cluster-admin
        assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
            ("ServiceAccount", "antdt-master")]


def test_task_service_account_has_no_token():
    assert _one("ServiceAccount", "antdt-task")["automountServiceAccountToken"] is False
    assert not [b for b in _of_kind("RoleBinding") + _of_kind("ClusterRoleBinding")
                if any(s["name"] == "antdt-task" for s in b["subjects"])]


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are modelled here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _admitted_ports(pod: dict, source: dict) -> set:
    """TCP ports of a pod (labels) that a pod of the same namespace (labels) may reach,
    under the file's policies, for a plugin that enforces them."""
    policies = [p for p in _of_kind("NetworkPolicy") if _selects(p["spec"]["podSelector"], pod)]
    assert policies, f"no policy selects {pod}: all ingress would be open"
    ports = set()
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), "a rule without `from` admits every source"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, "no namespaceSelector / ipBlock peers"
            if any(_selects(peer["podSelector"], source) for peer in rule["from"]):
                assert rule.get("ports"), "a rule without `ports` admits every port"
                ports |= {(p["protocol"], p["port"]) for p in rule["ports"]}
    return ports


def test_network_policy_admits_tf_port_only_from_antdt_pods():
    assert _admitted_ports(TASK_POD, TASK_POD) == {("TCP", 2222)}
    assert _admitted_ports(TASK_POD, MASTER_POD) == {("TCP", 2222)}
    assert _admitted_ports(TASK_POD, OTHER_POD) == set()
    assert _admitted_ports(TASK_POD, {}) == set()
    assert _admitted_ports(MASTER_POD, TASK_POD) == {("TCP", 7470), ("TCP", 7471)}
    assert _admitted_ports(MASTER_POD, OTHER_POD) == set()
    deny = _one("NetworkPolicy", "antdt-default-deny-ingress")["spec"]
    assert deny["podSelector"] == {"matchLabels": NAME} and "ingress" not in deny


def test_master_ports_agree_everywhere():
    _, container = _master_container()
    args = _args(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": int(args["port"]), "tf-rpc": int(args["tf_rpc_port"])}
    service = _one("Service", "antdt-master")["spec"]
    assert service["type"] == "ClusterIP" and service["selector"] == MASTER_POD
    assert {(p["port"], p["targetPort"]) for p in service["ports"]} == {
        (ports["grpc"], "grpc"), (ports["tf-rpc"], "tf-rpc")}
    assert _admitted_ports(MASTER_POD, TASK_POD) == {("TCP", p) for p in ports.values()}
    assert args["advertise"] == "antdt-master", "task pods reach the master by its Service"


def test_master_deployment_is_one_pod_on_its_state_volume():
    deployment = _one("Deployment", "antdt-master")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod, container = _master_container()
    assert deployment["spec"]["selector"]["matchLabels"] == MASTER_POD
    assert deployment["spec"]["template"]["metadata"]["labels"] == MASTER_POD
    assert pod["serviceAccountName"] == "antdt-master"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = _args(container)
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    state_dir = pathlib.PurePosixPath(args["state_dir"])
    on_claim = [path for path, vol in mounts.items()
                if vol in claims and state_dir.is_relative_to(path)]
    assert on_claim, f"--state_dir={state_dir} is not on a PersistentVolumeClaim mount"
    (mount_path,) = on_claim
    claim = claims[mounts[mount_path]]
    assert _one("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
    # task pods mount the same claim at the same path, run the same image
    assert args["kubernetes_volume_claim"] == claim
    assert args["kubernetes_mount_path"] == mount_path
    assert args["kubernetes_image"] == container["image"]
    assert _one("ServiceAccount", args["kubernetes_service_account"])
    assert "kubernetes_namespace" not in args, "default: the pod's own namespace"


def test_master_has_the_token_and_tls_that_a_non_loopback_bind_requires():
    """antdt_tf.auth.check_exposure: a master bound beyond loopback refuses to start
    without the job token and mutual TLS; no opt-out may be used."""
    pod, container = _master_container()
    args = _args(container)
    assert args["bind"] not in ("127.0.0.1", "localhost", "::1")
    assert not {"allow_unauthenticated_network_access", "allow_plaintext_network_access",
                "token_file"} & set(args)
    env = {e["name"]: e for e in container["env"]}
    token_ref = env["ANTDT_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token_ref == {"name": "antdt-job-token", "key": "token"}
    assert args["kubernetes_token_secret"] == token_ref["name"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    tls_mounts = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in secrets}
    for var in ("ANTDT_TLS_CERT", "ANTDT_TLS_KEY", "ANTDT_TLS_CA"):
        path = pathlib.PurePosixPath(env[var]["value"])
        assert any(path.parent == pathlib.PurePosixPath(m) for m in tls_mounts), var
    assert not any(a.startswith("--tls_") for a in container["args"])


def test_master_arguments_are_flags_the_master_defines():
    """Parsed by the master's own absl flags, in a fresh interpreter running this
    checkout's code (no flags of other test modules)."""
    _, container = _master_container()
    assert container["command"] == ["antdt-master"]
    script = (
        "import json, sys\n"
        "import antdt_tf.master.__main__ as m\n"
        "from absl import flags\n"
        "args, pending = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))\n"
        "defined = set(flags.FLAGS)\n"
        "skipped = [a for a in args if a[2:].split('=')[0] in pending - defined]\n"
        "flags.FLAGS(['antdt-master'] + [a for a in args if a not in skipped])\n"
        "print(json.dumps({'file': m.__file__, 'skipped': skipped}))\n")
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(container["args"]),
         json.dumps(sorted(PENDING_MASTER_FLAGS))],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120)
    assert out.returncode == 0, f"antdt-master rejects its arguments:\n{out.stderr[-2000:]}"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert pathlib.Path(result["file"]).is_relative_to(ROOT)
    assert result["skipped"] == []
