"""Compressed raw images to a file: ferry copy of a .zst (one frame), a pzstd .zst
(independent frames, decompressed in parallel by ferry), an .xz of several blocks and a
.gz, against the tools decompressing into a file (`zstd -d`, `pzstd -d -p 2`,
`xz -d -T2`, `gzip -d`; `pigz -d` where installed). The tools write every byte; ferry
leaves the zero runs as holes. Optional: `run.py --only decompress`.
"""

import subprocess

from harness import GiB, Case, Command, peer, which

FORMATS = [
    # name, compress argv (reads $0, writes stdout), ferry options, peers (label, shell command)
    ("zst", ["zstd", "-q", "-3", "-T2", "-c"], [],
     [("zstd -d", 'zstd -q -d -f -c "$0" > "$1"')]),
    ("pzstd.zst", ["pzstd", "-q", "-p", "2", "-c"], [],
     [("pzstd -d -p 2", 'pzstd -q -d -p 2 -f -c "$0" > "$1"'),
      ("zstd -d", 'zstd -q -d -f -c "$0" > "$1"')]),
    ("xz", ["xz", "-1", "-T2", "-c"], [],
     [("xz -d -T2", 'xz -d -T2 -c "$0" > "$1"')]),
    ("gz", ["gzip", "-1", "-c"], ["--source-size"],
     [("gzip -d", 'gzip -d -c "$0" > "$1"'), ("pigz -d", 'pigz -d -c "$0" > "$1"')]),
]


def compressed(env, image, name, argv):
    """IMAGE compressed by ARGV, made once and reused while newer than the image."""
    path = env.workdir / f"{image.path.stem}.{name}"
    if env.dry:
        return path
    if not path.exists() or path.stat().st_mtime < image.path.stat().st_mtime:
        env.log(f"making {path}")
        with open(path, "wb") as out:
            subprocess.run([*argv, str(image.path)], check=True, stdout=out)
    return path


def cases(env):
    image = env.image("half-1g", "half", env.size(1 * GiB))
    found = []
    for name, argv, options, peers in FORMATS:
        if not which(argv[0]):
            continue
        source = compressed(env, image, name, argv)
        case_name = f"decompress-{name.replace('.', '-')}-1g"
        target = env.target(case_name)

        def remove(target=target):
            if not env.keep_targets and target.exists():
                target.unlink()

        def check(_result, target=target):
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(image.path), str(target)], capture_output=True, text=True)
            if cmp.returncode != 0:
                return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
            return None

        extra = [o for opt in options for o in (opt, str(image.size))]
        commands = [Command("ferry copy", [env.ferry, "copy", *extra, source, target],
                            ferry=True, setup=remove, cleanup=remove, check=check)]
        for label, shell in peers:
            commands.append(peer(label, ["sh", "-c", shell, source, target],
                                 tool=shell.split()[0],
                                 install="apt-get install -y zstd xz-utils gzip pigz",
                                 setup=remove, cleanup=remove, check=check))
        found.append(Case(
            name=case_name,
            title=f"Decompress to file: 1 GiB, 50% data in scattered 1 MiB runs, as .{name}",
            commands=commands,
            optional=True,
        ))
    return found
