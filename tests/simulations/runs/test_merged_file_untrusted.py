"""``load_merged`` on a results folder someone sent: a ``model`` (or ``methods`` entry) that is
an import path is refused before it is imported unless the caller allows it; a row whose model
does not fit this machine is refused before it is built; a safetensors header that is not the
model's is refused before any tensor is read. Each refusal is one ``ConfigError`` line."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from fedlmc.simulations import load_merged, validate_run_config
from fedlmc.simulations.config import run_schema
from fedlmc.simulations.config.schema import ConfigError
from tests.simulations.runs.test_merged_file import write_run

FACTORY = """
from pathlib import Path
from torch import nn

Path(__file__).with_name("imported").touch()  # what a crafted model file could do instead


def make_net(width, num_classes, in_shape, norm):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))
"""


def write_factory_run(folder: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """A run folder whose rows name the model ``folder/net.py:make_net`` (not imported here);
    its model path and saved weights."""
    folder.mkdir(parents=True)
    (folder / "net.py").write_text(FACTORY)
    model = f"{folder / 'net.py'}:make_net"
    config = validate_run_config({"dataset": "mnist5k", "model": model}, check_devices=False)
    state = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).state_dict()
    save_file(state, folder / "merged-average.safetensors")
    keys = {k: config[k] for k in run_schema() if k != "out-dir"}
    pd.DataFrame([{"method": "average", **keys, "temperature": 1.0}]).to_csv(
        folder / "results.csv", index=False
    )
    return model, state


def refusal(folder: Path, method: str = "average", **kwargs) -> str:
    with pytest.raises(ConfigError) as error:
        load_merged(folder, method, **kwargs)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_model_file_named_by_the_results_is_not_imported_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLMC_MODEL_ALLOW", raising=False)
    model, state = write_factory_run(tmp_path / "run")
    message = refusal(tmp_path / "run")
    assert not (tmp_path / "run" / "imported").exists()
    assert message.startswith(f"model = {model!r} in the results is an import path")
    assert message.endswith(f"load_merged(..., allow=[{model!r}]) or FEDLMC_MODEL_ALLOW")
    assert "allowed: a registered model (mlp, vgg11, resnet20, vit" in message

    refusal(tmp_path / "run", allow=model + "_v2")  # one path, not a string holding it
    merged = load_merged(tmp_path / "run", "average", allow=[model])  # the caller trusts it
    assert (tmp_path / "run" / "imported").exists()
    assert all(torch.equal(merged.model.state_dict()[k], v) for k, v in state.items())


def test_the_allow_list_variable_admits_a_model_file(tmp_path, monkeypatch):
    model, _ = write_factory_run(tmp_path / "run")
    monkeypatch.setenv("FEDLMC_MODEL_ALLOW", "/somewhere/else.py:*")
    refusal(tmp_path / "run")
    assert not (tmp_path / "run" / "imported").exists()
    monkeypatch.setenv("FEDLMC_MODEL_ALLOW", f"{model.rpartition(':')[0]}:*")
    assert load_merged(tmp_path / "run", "average").method == "average"
    assert (tmp_path / "run" / "imported").exists()


@pytest.mark.parametrize(
    ("key", "value"), [("methods", "average,sent_module:merge"), ("align", "sent_module:merge")]
)
def test_a_merge_method_module_named_by_the_results_is_not_imported(
    tmp_path, monkeypatch, key, value
):
    """A ``methods`` entry or ``align`` ``module:function`` is imported by validation: a module
    the sender placed where Python finds it (the working directory) would run."""
    monkeypatch.delenv("FEDLMC_MODEL_ALLOW", raising=False)
    write_run(tmp_path / "run")
    (tmp_path / "sent_module.py").write_text(FACTORY.replace("make_net", "merge"))
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    rows.assign(**{key: value}).to_csv(tmp_path / "run" / "results.csv", index=False)
    message = refusal(tmp_path / "run")
    assert message.startswith(f"{key} = 'sent_module:merge' in the results is an import path")
    assert not (tmp_path / "imported").exists()


def test_a_row_too_wide_for_this_machine_is_refused_before_the_model_is_built(tmp_path):
    """Inside every key's range (width <= 1024), the MLP at width 1000 has 128,000 units a
    layer: about 1.6e10 parameters, checked against the memory available now."""
    write_run(tmp_path / "run")
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    wide = rows.assign(width=1000.0, **{"base-hidden": 128})
    wide.to_csv(tmp_path / "run" / "results.csv", index=False)
    message = refusal(tmp_path / "run")
    assert message.startswith("width = 1000: the mlp at width 1000 has about ")
    assert "parameters; building it and reading its weights need about " in message
    assert "GiB), available now " in message
    assert message.endswith("allowed: a model that fits the memory available now")


def rewrite_header(path: Path, edit, pad: bool = False) -> None:
    """``path`` with its safetensors header replaced by ``edit(header)``, its data kept (and
    doubled with zero bytes when ``pad``)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = edit(json.loads(raw[8 : 8 + length]))
    text = json.dumps(header).encode()
    data = raw[8 + length :]
    path.write_bytes(struct.pack("<Q", len(text)) + text + data + bytes(len(data) if pad else 0))


def huge(header: dict) -> dict:
    name = next(k for k in header if k != "__metadata__")
    header[name] = {"dtype": "F32", "shape": [100000, 100000], "data_offsets": [0, 4 * 10**10]}
    return header


def float64(header: dict) -> dict:
    """Every tensor declared float64 over twice its bytes (a file safetensors reads whole)."""
    offset = 0
    for name in sorted(k for k in header if k != "__metadata__"):
        size = 2 * (header[name]["data_offsets"][1] - header[name]["data_offsets"][0])
        header[name] = {**header[name], "dtype": "F64", "data_offsets": [offset, offset + size]}
        offset += size
    return header


def test_a_header_claiming_a_huge_tensor_is_refused_before_any_tensor_is_read(tmp_path):
    write_run(tmp_path / "run")
    path = tmp_path / "run" / "merged-average.safetensors"
    rewrite_header(path, huge)
    message = refusal(tmp_path / "run")
    assert message.startswith(f"{path}: tensor ")
    assert "is F32 [100000, 100000] in its header; allowed: F32 [" in message


def test_a_header_of_another_dtype_is_refused_not_cast(tmp_path):
    write_run(tmp_path / "run")
    path = tmp_path / "run" / "merged-average.safetensors"
    rewrite_header(path, float64, pad=True)
    assert "is F64 [" in refusal(tmp_path / "run")


def test_a_header_length_beyond_the_file_is_refused_unread(tmp_path):
    write_run(tmp_path / "run")
    path = tmp_path / "run" / "merged-average.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + path.read_bytes()[8:])
    message = refusal(tmp_path / "run")
    assert message.startswith(f"{path}: its header claims 4,611,686,018,427,387,904 bytes")


def test_a_results_file_that_is_no_bounded_regular_file_is_refused_unread(tmp_path):
    """``results.csv`` is read only as a regular file of at most 256 MiB: a FIFO in its place
    (opening it would block), a link to ``/dev/zero`` (read without end) and a file over the
    limit (here sparse: nothing of it is read) are each one line naming the file, what it is and
    what is allowed. Before, the first two were said to be missing and the third was read."""
    write_factory_run(tmp_path / "run")
    results = tmp_path / "run" / "results.csv"
    allowed = "allowed: a regular file of at most 268,435,456 bytes (256 MiB)"
    results.unlink()
    os.mkfifo(results)
    assert (
        refusal(tmp_path / "run")
        == f"results file {str(results)!r} is a FIFO (named pipe); {allowed}"
    )
    results.unlink()
    results.symlink_to("/dev/zero")
    assert refusal(tmp_path / "run").endswith(f"is a character device; {allowed}")
    results.unlink()
    with results.open("wb") as sparse:
        sparse.truncate((256 << 20) + 1)
    assert refusal(tmp_path / "run").endswith(f"has 268,435,457 bytes; {allowed}")


def test_a_results_file_that_is_no_table_is_one_line(tmp_path):
    """A ``results.csv`` pandas cannot parse (binary junk) is one line, not a traceback."""
    write_factory_run(tmp_path / "run")
    (tmp_path / "run" / "results.csv").write_bytes(b'a,b\n"1,2\n\xff\xfe,3,4,5\n')
    assert "not a results table" in refusal(tmp_path / "run")
