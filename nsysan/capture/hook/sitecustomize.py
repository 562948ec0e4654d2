"""Imported by every Python process that ``nsysan capture`` starts (it is first on PYTHONPATH).

In a torchrun worker (RANK and LOCAL_RANK are set, and no parent process marked it already), it
writes one NVTX mark in the ``nsysan`` domain:
``nsysan rank=R local_rank=L world_size=W``, which ``nsysan report`` uses to attribute the process
to its rank. Then it hands over to any other sitecustomize on the path, so user set-up still runs.
It never raises: a capture must not fail because of it.
"""

import os
import sys


def _mark_rank() -> None:
    rank = os.environ.get("RANK")
    # a torchrun worker has RANK and LOCAL_RANK; a launcher may have RANK alone (Kubeflow, Slurm)
    if rank is None or os.environ.get("LOCAL_RANK") is None or os.environ.get("NSYSAN_RANK_MARKED"):
        return
    # children (multiprocessing helpers, data-loader workers) inherit RANK but are not the rank
    os.environ["NSYSAN_RANK_MARKED"] = str(os.getpid())
    message = (
        f"nsysan rank={rank} local_rank={os.environ.get('LOCAL_RANK', '')} "
        f"world_size={os.environ.get('WORLD_SIZE', '')}"
    )
    try:
        import nvtx

        nvtx.mark(message=message, domain="nsysan")
    except Exception:
        pass


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if entry and os.path.abspath(entry) != here:
            candidate = os.path.join(entry, "sitecustomize.py")
            if os.path.isfile(candidate):
                with open(candidate) as fh:
                    exec(compile(fh.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
                return


try:
    _mark_rank()
    _chain()
except Exception:
    pass
