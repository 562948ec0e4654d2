"""nsysan: findings from Nsight Systems captures of distributed PyTorch jobs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("nsysan")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
