#!/usr/bin/env python3
"""Mean seconds per step of `lockstep grpo --metrics` runs, split by phase, as a Markdown table.

  python3 scripts/grpo_split.py NAME=FILE.jsonl [NAME=FILE.jsonl ...]

Each FILE is one run's JSONL metrics (one object per GRPO step). Prints one row per run: steps,
mean step / rollout / reward / forward / backward / optimizer / weight-sync / hash seconds, the
logp mismatches summed over the steps, and the first and last five steps' mean reward.
"""
import json
import sys

FIELDS = ["step_s", "rollout_s", "reward_s", "forward_s", "backward_s", "optimizer_s",
          "weight_sync_s", "hash_s"]


def main(argv):
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("| run | steps | " + " | ".join(f[:-2] for f in FIELDS) +
          " | logp mismatches | reward first 5 / last 5 |")
    print("|---" * (len(FIELDS) + 4) + "|")
    for arg in argv:
        name, path = arg.split("=", 1)
        try:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            print("grpo_split: %s: %s" % (path, e), file=sys.stderr)
            return 1
        if not rows:
            print("grpo_split: %s has no steps" % path, file=sys.stderr)
            return 1
        mean = {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in FIELDS}
        rewards = [r["reward_mean"] for r in rows]
        first, last = rewards[:5], rewards[-5:]
        print("| %s | %d | %s | %d | %.3f / %.3f |" % (
            name, len(rows), " | ".join("%.3f" % mean[k] for k in FIELDS),
            sum(r["logp_mismatches"] for r in rows), sum(first) / len(first),
            sum(last) / len(last)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
