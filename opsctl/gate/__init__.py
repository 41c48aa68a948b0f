"""The release gate: `measure` benches a release on the host in rounds, `decide` judges it
against the stored baseline with the speedup `interval`; `results`, `workloads`, `canary` and
`baseline` are what it measures and compares with."""
