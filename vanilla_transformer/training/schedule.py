"""Section 5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9, and the learning rate of equation (3) (warm-up, then
the inverse square root of the step)."""

import torch


def inverse_sqrt_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Equation (3): lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), for step >= 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer_and_schedule(model: torch.nn.Module, d_model: int, warmup_steps: int, scale: float):
    """Adam (5.3) and a LambdaLR whose k-th optimizer step (counting from 1) uses equation (3)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: inverse_sqrt_learning_rate(done + 1, d_model, warmup_steps, scale)
    )
    return optimizer, schedule
