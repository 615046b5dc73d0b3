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

    return [_render_case(env), _rollout_case(env), Case(
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


RENDER = "render-rollout-10000-pvcs"
RENDER_LABEL = "ferry operator render: 10,000 claims, 500 nodes"


def rollout_file(nodes, limit, count):
    """A cluster of `nodes` Ready nodes whose EBS driver attaches `limit` volumes each, and
    one Transfer generating `count` claims of its default class."""
    docs = ["""apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: ebs
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer"""]
    for i in range(nodes):
        docs.append(f"""apiVersion: v1
kind: Node
metadata: {{name: node-{i:03}}}
status: {{conditions: [{{type: Ready, status: "True"}}]}}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {{name: node-{i:03}}}
spec: {{drivers: [{{name: ebs.csi.aws.com, nodeID: i-{i}, allocatable: {{count: {limit}}}}}]}}""")
    docs.append(f"""apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: fleet, namespace: vms}}
spec:
  source: {{url: "https://images.example.com/golden.qcow2"}}
  pvcTemplates: {{namePrefix: vm-disk-, count: {count}, size: 20Gi, volumeMode: Block}}""")
    return "\n---\n".join(docs) + "\n"


def _render_case(env):
    """Issue 30 part 6: the 10,000-PVC rollout planned on paper: one golden image into
    10,000 generated claims over 500 nodes whose CSI driver attaches 25 volumes each."""
    path = env.workdir / "rollout-10000.yaml"
    if not env.dry:
        path.write_text(rollout_file(500, 25, 10000))

    def check(result):
        first = result.stderr.strip().splitlines()[:1]
        want = ("Transfer vms/fleet: Running (copy): 10000 targets in 500 mover groups "
                "over 500 nodes")
        if not first or not first[0].startswith(want):
            return f"unexpected plan: {first}"
        pods = result.stdout.count("\nkind: Pod\n")
        claims = result.stdout.count("\nkind: PersistentVolumeClaim\n")
        if pods != 500 or claims != 10000:
            return f"{pods} mover pods and {claims} claims planned, expected 500 and 10000"
        return None

    def seconds(results):
        return results[RENDER][RENDER_LABEL].median

    def rss(results):
        return results[RENDER][RENDER_LABEL].peak_rss_mib

    return Case(
        name=RENDER,
        title="ferry operator render of one golden image into 10,000 pvcTemplates "
              "claims over 500 nodes (CSINode attach limit 25): the groups, the children, "
              "their claims and mover pods",
        commands=[Command(RENDER_LABEL, [env.ferry, "operator", "render", str(path)],
                          ferry=True, check=check)],
        goals=[
            Goal("render of the 10,000-target plan < 2 s",
                 lambda r: (seconds(r) < 2.0, f"{seconds(r):.2f} s")),
            Goal("its memory <= 256 MiB",
                 lambda r: (rss(r) <= 256, f"{rss(r):.0f} MiB")),
        ],
    )


ROLLOUT = "operator-rollout-10000-pvcs"
ROLLOUT_LABEL = "operator: 1 Transfer, 10,000 claims, 500 nodes"


def _rollout_case(env):
    """Issue 30 part 6 in the stand-in: the operator's real controllers fan one Transfer out
    into 10,000 generated claims over 500 nodes (attach limit 25), --max-movers 50, 1 s
    mover jobs."""
    scale = env.mkimage.with_name("ferry-operator-scale")

    def out(results):
        runs = results[ROLLOUT][ROLLOUT_LABEL].runs
        return json.loads(runs[0].stdout.strip().splitlines()[-1])

    def check(result):
        try:
            o = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"no JSON result: {result.stdout[-500:]} {result.stderr[-500:]}"
        if o["phase"] != "Succeeded" or o["targets_succeeded"] != o["rollout_targets"]:
            return f"phase {o['phase']}, {o['targets_succeeded']} targets written"
        return None

    def goal(text, judge):
        return Goal(text, lambda results: judge(out(results)))

    return Case(
        name=ROLLOUT,
        title="Operator fan-out on the API stand-in: one Transfer into 10,000 pvcTemplates "
              "claims over 500 nodes (CSINode attach limit 25), --max-movers 50, 1 s jobs",
        commands=[Command(ROLLOUT_LABEL, [scale, "--rollout", "10000", "--nodes", "500",
                                          "--attach-limit", "25", "--max-movers", "50",
                                          "--job-ms", "1000"],
                          ferry=True, check=check)],
        goals=[
            goal("every claim written, one group per node",
                 lambda o: (o["targets_succeeded"] == o["rollout_targets"]
                            and o["groups"] == o["nodes_used"] == o["nodes"],
                            f"{o['targets_succeeded']} claims, {o['groups']} groups on "
                            f"{o['nodes_used']} nodes")),
            goal("no mover waits on an attach limit",
                 lambda o: (o["mover_updates_unschedulable"] == 0,
                            f"{o['mover_updates_unschedulable']} unschedulable updates")),
            goal("at most 50 movers at once",
                 lambda o: (o["most_movers_at_once"] <= 50, f"{o['most_movers_at_once']}")),
            goal("operator memory <= 256 MiB",
                 lambda o: (o["operator_peak_rss_mib"] <= 256,
                            f"{o['operator_peak_rss_mib']:.0f} MiB")),
            goal("operator API writes per target, CPU (reported)",
                 lambda o: (None, f"{o['writes_per_target']:.2f} writes, "
                                  f"{o['operator_cpu_seconds']:.1f} s CPU")),
        ],
    )
