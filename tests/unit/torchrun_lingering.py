"""A torchrun whose agent for node 1 stays alive after its ranks have finished, as an agent waits
at torchelastic's exit barrier (up to 5 minutes) for a node that has died: what lesson 07's
two-"node" run hit once when rank 0 aborted at exit. Everything else is the installed torchrun.

    COURSE_TORCHRUN_MODULE=torchrun_lingering  (with this folder on PYTHONPATH)
"""
import sys
import time

import torch.distributed.run as run

if __name__ == "__main__":
    try:
        run.main()
    finally:
        if "--node_rank=1" in sys.argv:
            time.sleep(600)
