"""Engine tuning sweeps (optional: run with `--only tune`): ferry copy of the 4 GiB half-data
image with different request sizes and work units, the measurement behind the engine's
defaults (services/engine/src/options.rs)."""

from harness import GiB, Case, Command

REQUEST_SIZES = ["64K", "128K", "256K", "512K", "1M", "4M"]
WORK_UNITS = ["16M", "64M", "256M"]


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    target = env.target("tune")

    def remove():
        if target.exists():
            target.unlink()

    def sweep(option, values, default):
        return [Command(f"ferry copy {option} {v}", [env.ferry, "copy", option, v, image.path, target],
                        ferry=(v == default), setup=remove, cleanup=remove) for v in values]

    return [
        Case(name="tune-request-size", title="Tuning: request size (4 GiB, 50% data, 8 workers)",
             commands=sweep("--request-size", REQUEST_SIZES, "256K"), optional=True,
             notes=["the ratio column is the default (256K) over each size"]),
        Case(name="tune-work-unit", title="Tuning: work unit (4 GiB, 50% data, 8 workers)",
             commands=sweep("--work-unit", WORK_UNITS, "64M"), optional=True,
             notes=["the ratio column is the default (64M) over each size"]),
    ]
