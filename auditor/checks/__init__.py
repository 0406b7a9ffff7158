"""Every check is run by the CLI, the daemon and the Spark scan, and judged again by
`explain`, what-if and the self-test, so its judgement lives in a pure core that all of them
call, and its I/O in a driver of the one shape every check shares.

The audit checks: pure analysis cores, and one shape of async driver around them.

Cores (`replicas`, `placement`, `ledger_check`, `bookie_check`, `grace`,
`owners`) are pure functions of metadata and answers; `explain` and the
self-test call them too. Findings and reports are `findings` (`violation`,
`tally` below it); `runner` is the table of drivers the CLI, the daemon and a
scan share.

The driver convention, the same for every check (`replicas_run`,
`placement_run`, `ledger_check_run`, `bookie_check_run`, `metadata_run`,
`grace_run`):
- `run_<check>_check(ctx) -> CheckReport` runs the whole check; `runner.driver`
  names it.
- One class, `<Check>Run`, is one run. It owns a `recorder.RunRecorder`, through
  which each ledger is settled exactly once (ok, skipped with its reason,
  violation, metadata_invalid; drops counted beside), so the report and the
  per-ledger outcome rows (`ctx.outcome`) cannot disagree; its `judge(...)`
  settles one ledger, and the run ends with `recorder.finish()`.
- Work per ledger that waits on I/O goes through `pool.bounded` (at most N at
  once). In the checks that read bookies (replicas, ledgers), a would-be
  violation goes through `reread.Reread` before it is reported (BP-34: a
  fresh look at the mark and a re-read of the metadata, judged again on a new
  version); the bookie check reads its would-be violations again in batches
  after the registry's second read; the others report what the walk read.
- A mark is written with the metadata version it was decided on
  (`ctx.mark_underreplicated(..., version=...)`): only while the ledger is at
  that version, else for the missing bookies its new ensembles still name.
- What `explain` needs of one ledger is a public function of the driver that
  the run calls too (`replicas_run.bookie_answers`,
  `ledger_check_run.ledger_violation`, `placement_run.placement_policy`).
Everything else in a driver is what is specific to its check.
"""
