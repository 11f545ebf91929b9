#!/bin/bash
# A: HEAD (4ee5626), B: + the drop ends a cast's dwell. Interleaved, oscillating only.
for i in 1 2 3; do
  for side in A B; do
    if [ $side = A ]; then dir=<worktree of 4ee5626>; else dir=<worktree with the change>; fi
    (cd $dir && .venv/bin/python -m benchmarks.adaptive --scenario oscillating --choices powersgd-r4 adaptive --seeds 0 1 --repeats 1 \
      --json-out benchmarks/results/adaptive_s29_ab_${side}${i}.json --md-out benchmarks/results/adaptive_s29_ab_${side}${i}.md --plot benchmarks/results/adaptive_s29_ab_${side}${i}.png --keep benchmarks/results/adaptive_s29_ab_keep_${side}${i} > benchmarks/results/adaptive_s29_ab_${side}${i}.log 2>&1)
    echo "$side$i done $(date +%T)"
  done
done
