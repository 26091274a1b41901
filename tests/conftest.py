"""What every test gets: torch's thread count put back after it (a run sets it for its process
with `--torch-threads`), so that one test's run does not slow or change the next."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
