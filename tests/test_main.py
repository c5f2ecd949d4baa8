"""python -m softmax_ext (softmax_ext/__main__.py): arguments, build facts,
the check's verdict and exit status, the timing table, --csv and --plot.
Kept fast: the timing runs use monkeypatched tiny shapes."""

import csv
import subprocess
import sys

import pytest
import torch

from softmax_ext import __main__ as cli


def _tiny_cases(device, quick):
    return [((8, 64), -1, torch.float32), ((4, 6, 5), 1, torch.bfloat16)]


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--reps", "-3"], ["--reps", "x"], ["--device", "tpu"],
                                  ["--no-timing", "--csv", "out.csv"], ["--bogus"]])
def test_bad_arguments_exit_2_without_traceback(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m softmax_ext" in err and "Traceback" not in err


def test_bad_argument_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "softmax_ext", "--reps", "0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "--reps" in result.stderr and "positive integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_plot_without_matplotlib_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(SystemExit) as info:
        cli.main(["--plot", "x.png"])
    assert info.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="only where no GPU is visible")
def test_device_cuda_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--device", "cuda"])
    assert info.value.code == 2 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("archs, capability, ok, says", [
    ([80, 90], (9, 0), True, "runs the build's sm_90"),
    ([80, 90], (8, 6), True, "runs the build's sm_80"),
    ([90], (8, 0), False, 'TORCH_CUDA_ARCH_LIST="8.0"'),
    ([80, 90], (12, 0), True, "PTX"),
    ([], (9, 0), False, "not in the build"),
])
def test_gpu_arch_status(archs, capability, ok, says):
    got_ok, message = cli.gpu_arch_status(archs, capability)
    assert got_ok == ok and says in message


def test_checks_pass_and_report_every_op(capsys):
    assert cli.main(["--device", "cpu", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "built against" in out and "running" in out
    for op in ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "autograd softmax"):
        assert f"\n  {op} " in out
    assert "FAIL" not in out and "all checks passed" in out


def test_a_wrong_op_fails_the_check(monkeypatch, capsys):
    import softmax_ext

    real = softmax_ext.log_softmax
    monkeypatch.setattr(softmax_ext, "log_softmax", lambda x, dim=-1, dtype=None: real(x, dim, dtype) + 0.01)
    assert cli.main(["--device", "cpu", "--no-timing"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "checks FAILED" in out


def test_timing_table_and_csv(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "timing_cases", _tiny_cases)
    path = tmp_path / "t.csv"
    assert cli.main(["--device", "cpu", "--quick", "--reps", "2", "--csv", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[ 8/8]" in out and "vs torch" in out
    rows = list(csv.DictReader(open(path)))
    assert {r["impl"] for r in rows} == {"softmax_ext", "torch"}  # no torch.compile with --quick on a CPU
    assert len(rows) == 2 * 8
    assert all(float(r["ms"]) > 0 and float(r["speedup_vs_torch"]) > 0 for r in rows)


def test_plot_writes_a_png(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(cli, "timing_cases", _tiny_cases)
    path = tmp_path / "t.png"
    assert cli.main(["--device", "cpu", "--quick", "--reps", "2", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
