"""The operator at scale (issue 29's scale goals): its real controllers against the test
kit's stateful API stand-in, 1,000 Transfers applied at once with --max-movers 50, and 50
Transfers whose movers report progress every 200 ms (ferry-operator-scale, tests/src/bin).

No real cluster: the API server, scheduler, binding and kubelet are the stand-in's. The
operator runs in a process of its own and reaches the stand-in over loopback HTTP, so its
peak RSS (VmHWM) and CPU time are its own. Mover jobs take 1 s each.
"""

import json

from harness import Case, Command, Goal

NAME = "operator-scale-1000-transfers"
LABEL = "operator: 1,000 Transfers, --max-movers 50"


def cases(env):
    scale = env.mkimage.with_name("ferry-operator-scale")

    def check(result):
        try:
            out = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"no JSON result: {result.stdout[-500:]} {result.stderr[-500:]}"
        if out["succeeded"] != out["transfers"]:
            return f"{out['succeeded']} of {out['transfers']} Transfers Succeeded"
        return None

    return [Case(
        name=NAME,
        title="Operator at scale on the API stand-in: 1,000 Transfers applied at once, "
              "--max-movers 50, 1 s mover jobs; then 50 running Transfers' progress writes",
        commands=[Command(LABEL, [scale, "--transfers", "1000", "--max-movers", "50",
                                  "--job-ms", "1000", "--progress-seconds", "40"],
                          ferry=True, check=check,
                          note="time includes the 40 s progress phase")],
        goals=[
            _goal("at most 50 movers at once", lambda o: (o["most_movers_at_once"] <= 50,
                                                          f"{o['most_movers_at_once']}")),
            _goal("every Transfer Succeeded", lambda o: (o["succeeded"] == o["transfers"],
                                                         f"{o['succeeded']}/{o['transfers']}")),
            _goal("a freed slot used within 2 s (max)",
                  lambda o: (o["slot_reuse_ms_max"] <= 2000,
                             f"median {o['slot_reuse_ms_median']:.0f} ms, "
                             f"max {o['slot_reuse_ms_max']:.0f} ms")),
            _goal("progress at most 1 write per 10 s per running Transfer (<= 6/min)",
                  lambda o: (o["progress_writes_per_minute_per_transfer"] <= 6.0,
                             f"{o['progress_writes_per_minute_per_transfer']:.1f}/min")),
            _goal("no polling while a mover runs (reads that are not watches, per minute per "
                  "running Transfer)",
                  lambda o: (o["reads_per_minute_per_running_transfer"] < 1.0,
                             f"{o['reads_per_minute_per_running_transfer']:.2f}/min")),
            _goal("API writes per Transfer lifecycle (reported)",
                  lambda o: (None, f"{o['writes_per_transfer']:.1f} "
                                   f"({o['events_per_transfer']:.1f} of them events)")),
            _goal("operator RSS <= 128 MiB at 1,000 resources",
                  lambda o: (o["operator_peak_rss_mib"] <= 128,
                             f"{o['operator_peak_rss_mib']:.0f} MiB")),
            _goal("operator CPU per Transfer lifecycle (reported)",
                  lambda o: (None, f"{o['operator_cpu_ms_per_transfer']:.1f} ms")),
        ],
    )]


def _out(results):
    runs = results[NAME][LABEL].runs
    return json.loads(runs[0].stdout.strip().splitlines()[-1])


def _goal(text, judge):
    return Goal(text, lambda results: judge(_out(results)))
