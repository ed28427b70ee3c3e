"""What the tests that compare Kiln with PyTorch 1.13 share."""
import numpy as np
import torch


def close(got, want, tol=1e-9):
    """got (a Kiln tensor or array) against want (a torch tensor or array): rtol = atol = tol."""
    want = want.detach().numpy() if torch.is_tensor(want) else want
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
