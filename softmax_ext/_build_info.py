import torch


def build_info() -> dict:
    """How softmax_ext._C was built: torch version, CUDA version (None for a
    CPU-only build) and the compiled GPU architectures (e.g. [80, 90])."""
    torch_version, cuda_version, archs = torch.ops.softmax_ext._build_info.default()
    return {
        "torch": torch_version,
        "torch_runtime": torch.__version__,
        "cuda": cuda_version or None,
        "cuda_archs": list(archs),
    }
