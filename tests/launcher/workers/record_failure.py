"""Rank 1 raises inside a @record-decorated main: PyTorch writes TORCHELASTIC_ERROR_FILE."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


def load_batch(step):
    raise ValueError(f"corrupt batch at step {step}")


@record
def main():
    if os.environ["RANK"] == "1":
        load_batch(17)
    import time
    time.sleep(30)


if __name__ == "__main__":
    main()
