"""pivotrl through verl's own registries, on the CPU: advantages and a policy loss.

    bash scripts/verl_env.sh                      # the verl venv (verl 0.9.1)
    .venv-verl/bin/python examples/verl_registry.py

`import verl` loads pivotrl's entry point (group verl.plugins), which registers
pivotrl_<estimator> and pivotrl_<loss> in verl.trainer.ppo.core_algos and the
pivotrl_sync / pivotrl_colocate_async / pivotrl_separate_async v1 trainers. This
script calls them the way verl's trainer does; a training run only sets config
keys (see configs/verl/).
"""

from __future__ import annotations

import numpy as np
import torch
import verl  # noqa: F401  (plugin discovery registers pivotrl's names)
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from pivotrl.integrations.verl import compute_advantage


def main() -> None:
    torch.manual_seed(0)
    n, width = 8, 6  # two prompts, four responses each
    mask = torch.arange(width).unsqueeze(0) < torch.tensor([6, 4, 5, 3, 6, 6, 2, 5]).unsqueeze(1)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    token_level_rewards = torch.zeros(n, width)
    token_level_rewards[torch.arange(n), mask.sum(1) - 1] = scores  # outcome reward on the last token
    old = -torch.rand(n, width) * 2
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": token_level_rewards,
            "response_mask": mask.long(),
            "old_log_probs": old,                               # what verl's trainer keeps
            "ref_log_prob": old + 0.1 * torch.randn(n, width),
            "entropys": torch.rand(n, width) * 2,
        },
        non_tensors={"uid": np.array(["p0"] * 4 + ["p1"] * 4, dtype=object)},
    )
    algorithm = {"adv_estimator": "pivotrl_ep_grpo", "norm_adv_by_std_in_grpo": True,
                 "pivotrl_kwargs": {"gamma": 5.0, "num_buckets": 3}}
    data = compute_advantage(data, "pivotrl_ep_grpo", config=algorithm)
    adv = data.batch["advantages"]
    print("EP-GRPO advantages (token-level):")
    print(adv.numpy().round(3))

    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1,
                         clip_ratio_low=0.2, clip_ratio_high=0.28)
    new = (old + 0.05 * torch.randn(n, width)).requires_grad_(True)
    loss_fn = core_algos.get_policy_loss_fn("pivotrl_tepo")
    loss, metrics = loss_fn(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                            loss_agg_mode="token-mean", config=config)
    loss.backward()
    print(f"pivotrl_tepo loss {loss.item():.4f}, grad norm {new.grad.norm().item():.4f}, "
          f"clip frac {metrics['actor/pg_clipfrac']:.3f}")


if __name__ == "__main__":
    main()
