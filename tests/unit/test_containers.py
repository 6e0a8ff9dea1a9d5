"""The container pieces that are pure: the image reference and bind grammars, and each runtime's exact argv."""

from __future__ import annotations

import json

import pytest

from envbuilder.core import containers
from envbuilder.core.containers import parse_image
from envbuilder.core.errors import UsageError

HUB_TAG = "docker://pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    "text",
    [HUB_TAG, NGC, "ubuntu:22.04", f"127.0.0.1:5000/torch/cpu:2.5@{DIGEST}", "/scratch/u/torch.sif",
     "oci-archive:/scratch/u/torch.tar", "oci:/scratch/u/layout", "localhost/a/b:1", "/w/i.sqfs"],
)  # fmt: skip
def test_image_references_that_are_taken(text: str) -> None:
    assert containers.image_problem(text) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("--nv", "cannot start with '-'"),
        ("-v/etc:/x", "cannot start with '-'"),
        (f"{NGC};id", "no whitespace or shell character"),
        ("pytorch/pytorch:$(id)", "no whitespace or shell character"),
        ("pytorch/pytorch 2.5", "no whitespace or shell character"),
        ("pytorch/pytorch:`x`", "no whitespace or shell character"),
        ("PyTorch/torch:1", "not an image reference"),
        ("nvcr.io/nvidia/pytorch:", "not an image reference"),
        ("pytorch/pytorch@sha256:short", "not an image reference"),
        ("/scratch/../etc/x.sif", "not a plain absolute image path"),
        ("/scratch/u/torch", "must be a .sif, .sqfs or OCI archive"),
        ("relative/x.sif", "named by its absolute path"),
        ("a\nb", "line break"),
    ],
)
def test_image_references_that_are_refused_say_why(text: str, says: str) -> None:
    problem = containers.image_problem(text)
    assert problem is not None
    assert says in problem[0]


def test_a_reference_is_parsed_into_host_repository_tag_and_digest() -> None:
    hub = parse_image(HUB_TAG)
    assert (hub.host, hub.repository, hub.tag, hub.tag_given) == (
        "docker.io",
        "pytorch/pytorch",
        HUB_TAG[25:],
        True,
    )
    assert hub.uri == "docker://docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    library = parse_image("ubuntu")
    assert (library.repository, library.tag, library.tag_given) == ("library/ubuntu", "latest", False)
    pinned = parse_image(f"127.0.0.1:5000/torch/cpu@{DIGEST}")
    assert (pinned.host, pinned.digest, pinned.loopback) == ("127.0.0.1:5000", DIGEST, True)
    assert pinned.name == f"127.0.0.1:5000/torch/cpu@{DIGEST}"
    assert not parse_image(NGC).loopback
    local = parse_image("oci-archive:/s/t.tar")
    assert (local.local, local.path, local.transport, local.uri) == (
        True,
        "/s/t.tar",
        "oci-archive",
        "oci-archive:/s/t.tar",
    )


@pytest.mark.parametrize("text", ["/scratch", "$SCRATCH", "${WORK}/data", "/tmp:/mnt/tmp"])
def test_binds_that_are_taken(text: str) -> None:
    assert containers.bind_problem(text) is None


@pytest.mark.parametrize("text", ["/a,/b", "scratch", "/a b", "-v", "/a:b", "$(id)", "/a:/b:/c"])
def test_binds_that_are_refused(text: str) -> None:
    assert containers.bind_problem(text) is not None


def test_apptainer_and_singularity_share_one_command_line() -> None:
    for name in ("apptainer", "singularity"):
        rt = containers.runtime(name)
        assert rt.fetch(parse_image(NGC), "/p/image.sif") == [
            [name, "pull", "--", "/p/image.sif", f"docker://{NGC}"]
        ]
        assert rt.exec("/p/image.sif", ["python", "-V"], binds=["/s", "/w:/work"], gpu=True, env={"A": "1"}) == [
            name, "exec", "--cleanenv", "--nv", "--bind", "/s,/w:/work", "--env", "A=1", "--", "/p/image.sif",
            "python", "-V",
        ]  # fmt: skip
        assert rt.shell("/p/image.sif", binds=["/s"]) == [name, "shell", "--bind", "/s", "--", "/p/image.sif"]
        assert rt.inspect("/p/image.sif") == [name, "inspect", "--json", "--labels", "--", "/p/image.sif"]


def test_apptainer_fetches_a_loopback_registry_over_http_and_converts_or_copies_local_images() -> None:
    rt = containers.runtime("apptainer")
    assert rt.fetch(parse_image("127.0.0.1:5000/t/cpu:1"), "/p/i.sif") == [
        ["apptainer", "pull", "--no-https", "--", "/p/i.sif", "docker://127.0.0.1:5000/t/cpu:1"]
    ]
    assert rt.fetch(parse_image("oci-archive:/s/t.tar"), "/p/i.sif") == [
        ["apptainer", "build", "--", "/p/i.sif", "oci-archive:/s/t.tar"]
    ]
    assert rt.fetch(parse_image("/s/t.sif"), "/p/i.sif") == []  # copied as it is


def test_charliecloud_pulls_into_its_store_and_converts_to_one_squashfs() -> None:
    rt = containers.runtime("charliecloud")
    assert rt.image_file == "image.sqfs"
    assert not rt.gpu_flag
    assert rt.fetch(parse_image("127.0.0.1:5000/t/cpu:1"), "/p/image.sqfs") == [
        ["ch-image", "pull", "--tls-no-verify", "--", "127.0.0.1:5000/t/cpu:1"],
        ["ch-convert", "-i", "ch-image", "-o", "squash", "127.0.0.1:5000/t/cpu:1", "/p/image.sqfs"],
    ]
    assert rt.fetch(parse_image("/s/t.tar"), "/p/image.sqfs") == [["ch-convert", "/s/t.tar", "/p/image.sqfs"]]
    assert rt.exec("/p/image.sqfs", ["python3", "-V"], binds=["/s"], env={"A": "1"}) == [
        "ch-run", "--unset-env=*", "--bind=/s", "--set-env=A=1", "/p/image.sqfs", "--", "python3", "-V",
    ]  # fmt: skip
    assert rt.inspect("/p/image.sqfs") == ["ch-run", "/p/image.sqfs", "--", "cat", "/ch/metadata.json"]


def test_podman_saves_one_oci_archive_and_runs_from_it() -> None:
    rt = containers.runtime("podman")
    assert rt.fetch(parse_image(NGC), "/p/image.tar") == [
        ["podman", "pull", "--", NGC],
        ["podman", "save", "--format", "oci-archive", "-o", "/p/image.tar", "--", NGC],
    ]
    assert rt.exec("/p/image.tar", ["python3"], binds=["/s"], gpu=True) == [
        "podman", "run", "--rm", "--network=host", "--device", "nvidia.com/gpu=all", "--volume=/s:/s", "--",
        "oci-archive:/p/image.tar", "python3",
    ]  # fmt: skip


def test_every_runtime_keeps_an_option_shaped_argument_out_of_option_position() -> None:
    # Whatever a value holds, it follows `--` or an option that takes it: it is never read as an option itself.
    for rt in containers.RUNTIMES.values():
        argv = rt.exec("/p/image", ["--help"], binds=["/s"])
        assert argv.index("--") < argv.index("--help")
        for fetch in rt.fetch(parse_image(NGC), "/p/image"):
            # ch-convert takes no `--`: its operands (a checked reference, an absolute path) cannot start with '-'.
            assert "--" in fetch or (
                fetch[0] == "ch-convert" and not any(a.startswith("-") for a in fetch[-2:])
            )


def test_each_runtime_keeps_its_layers_and_unpacking_where_it_is_told() -> None:
    work = {name: rt.work_env("/s/c", "/s/t") for name, rt in containers.RUNTIMES.items()}
    assert work == {
        "apptainer": {"APPTAINER_CACHEDIR": "/s/c", "APPTAINER_TMPDIR": "/s/t"},
        "singularity": {"SINGULARITY_CACHEDIR": "/s/c", "SINGULARITY_TMPDIR": "/s/t"},
        "charliecloud": {"CH_IMAGE_STORAGE": "/s/c"},
        "podman": {"TMPDIR": "/s/t"},
    }


def test_a_site_registry_mirror_stands_in_for_the_upstream_registry() -> None:
    mirrors = containers.registry_mirrors(
        {containers.MIRROR_VAR: "docker.io=127.0.0.1:5000/hub; nvcr.io=mirror.site"}
    )
    assert mirrors == {"docker.io": ("127.0.0.1:5000", "hub"), "nvcr.io": ("mirror.site", "")}
    hub = containers.mirrored(parse_image(HUB_TAG), mirrors)
    assert (hub.text, hub.uri, hub.loopback) == (HUB_TAG, f"docker://127.0.0.1:5000/hub/{HUB_TAG[9:]}", True)
    assert containers.mirrored(parse_image(NGC), mirrors).name == "mirror.site/nvidia/pytorch:24.05-py3"
    other = parse_image("ghcr.io/a/b:1")
    assert containers.mirrored(other, mirrors) is other
    assert containers.registry_mirrors({}) == {}


@pytest.mark.parametrize("text", ["docker.io", "docker.io=", "docker.io=-x", "docker.io=a b", "=m.site"])
def test_a_bad_registry_mirror_setting_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as info:
        containers.registry_mirrors({containers.MIRROR_VAR: text})
    assert info.value.message.startswith(f"{containers.MIRROR_VAR}: not a HOST=MIRROR pair")


def test_each_runtime_reads_the_labels_its_inspect_printed() -> None:
    labels = {"org.envbuilder.torch": "2.5.1"}
    apptainer = json.dumps({"data": {"attributes": {"labels": labels}}, "type": "container"})
    assert containers.runtime("apptainer").config(apptainer) == {"Labels": labels}
    charlie = json.dumps({"labels": labels, "env": {"CUDA_VERSION": "12.4.1"}, "arch": "amd64"})
    assert containers.runtime("charliecloud").config(charlie) == {
        "Labels": labels,
        "Env": ["CUDA_VERSION=12.4.1"],
    }
    podman = json.dumps([{"Config": {"Labels": labels, "Env": ["A=1"]}}])
    assert containers.runtime("podman").config(podman) == {"Labels": labels, "Env": ["A=1"]}
    for rt in containers.RUNTIMES.values():
        assert rt.config("not json") == {}
        assert rt.config("[]") == {}
