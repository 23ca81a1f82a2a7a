"""vflo's X25519 kernel (src/vflo/align/_x25519.c) built with AddressSanitizer and UndefinedBehaviorSanitizer, every
report fatal: RFC 7748's vectors, edge coordinates, points of small order, wrong sizes and a few thousand random
points go through the sanitized module's Python entry point, and its answers are OpenSSL's bytes.

The module is built in a temporary folder with the C compiler found here and loaded by a separate Python with the
sanitizer runtime preloaded (the interpreter itself is not instrumented) and Python's own allocator off, so that
every buffer is one the sanitizer watches. Two deliberately broken builds show that a bug would be reported.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tests.test_curve import RFC_7748_VECTORS
from tests.test_curve_differential import EDGE_U, Call, P, openssl, small_order_u

SOURCE = Path(__file__).resolve().parents[1] / "src" / "vflo" / "align" / "_x25519.c"
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
NO_IFMA = 77  # the runner's exit status where the CPU cannot run the kernel

# Reads calls (key, count, points) from argv[2], writes per call a status byte (0 answered, 1 refused) and the
# answer to argv[3]; then the sizes blind() must refuse.
RUNNER = r"""
import struct, sys
sys.path.insert(0, sys.argv[1])
import _x25519
if not _x25519.available():
    sys.exit(77)
data, out, at = open(sys.argv[2], "rb").read(), [], 0
while at < len(data):
    key, (n,) = data[at:at + 32], struct.unpack("<I", data[at + 32:at + 36])
    points = data[at + 36:at + 36 + 32 * n]
    at += 36 + 32 * n
    try:
        out.append(b"\0" + _x25519.blind(key, points))
    except ValueError:
        out.append(b"\1")
open(sys.argv[3], "wb").write(b"".join(out))
for key, points in ((b"k" * 31, b"p" * 32), (b"k" * 33, b"p" * 32), (b"k" * 32, b"p" * 33)):
    try:
        _x25519.blind(key, points)
    except ValueError:
        continue
    sys.exit("a wrong size was not refused")
assert _x25519.blind(b"k" * 32, b"") == b""
"""

# Broken builds: the kernel's source unchanged, a bug planted around it by a macro.
PLANTED = {
    # Every memcpy one byte too long: the first load of points writes past a stack array.
    "memcpy one byte long": ("#include <string.h>\n#undef memcpy\n"
                             "#define memcpy(d, s, n) memcpy((d), (s), (n) + 1)\n", "AddressSanitizer"),
    # Clearing the key also shifts an int past its width (undefined in C).
    "a shift past an int": ("#include <string.h>\n#undef memset\nstatic volatile int planted = 2;\n"
                            "#define memset(d, c, n) (memset((d), (c), (n)), (void)(planted << 31))\n",
                            "runtime error"),
}


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "gcc", "clang", "cc"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _runtime(cc: str) -> str | None:
    """The sanitizer runtime to preload into Python: gcc's libasan, or clang's shared one."""
    for name in ("libasan.so", "libclang_rt.asan-x86_64.so", "libclang_rt.asan.so"):
        found = Path(subprocess.run([cc, f"-print-file-name={name}"], check=False, capture_output=True,
                                    text=True).stdout.strip())
        if found.is_absolute() and found.exists():
            return str(found)
    return None


@pytest.fixture(scope="module")
def toolchain() -> tuple[str, str]:
    if sys.platform != "linux":
        pytest.skip("the sanitized module is loaded with LD_PRELOAD, which is Linux's")
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (gcc, clang, cc or $CC) to build a sanitized X25519 with")
    runtime = _runtime(cc)
    if runtime is None:
        pytest.skip(f"{cc} has no shared AddressSanitizer runtime to preload into Python")
    return cc, runtime


def build(cc: str, source: Path, folder: Path, optimize: str) -> None:
    """The extension module ``_x25519`` compiled from ``source`` with the sanitizers, in ``folder``."""
    shared_runtime = ["-shared-libasan"] if "clang" in Path(cc).name else []
    command = [cc, "-shared", "-fPIC", optimize, *SANITIZE, *shared_runtime,
               f"-I{sysconfig.get_paths()['include']}", f"-I{SOURCE.parent}", str(source),
               "-o", str(folder / f"_x25519{sysconfig.get_config_var('EXT_SUFFIX')}")]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr}"


def run(runtime: str, folder: Path, calls: list[Call]) -> tuple[subprocess.CompletedProcess[str], list[bytes | None]]:
    """The calls through the sanitized module in a fresh Python; its answers (None: refused)."""
    (folder / "in").write_bytes(b"".join(key + struct.pack("<I", len(pts) // 32) + pts for key, pts in calls))
    env = dict(os.environ, LD_PRELOAD=runtime, PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    done = subprocess.run([sys.executable, "-c", RUNNER, str(folder), str(folder / "in"), str(folder / "out")],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode == NO_IFMA:
        pytest.skip("this CPU lacks AVX-512 IFMA: the sanitized kernel cannot run")
    answers: list[bytes | None] = []
    data, at = (folder / "out").read_bytes() if (folder / "out").exists() else b"", 0
    for _, pts in calls:
        if at >= len(data):
            break
        refused = data[at] == 1
        answers.append(None if refused else data[at + 1:at + 1 + len(pts)])
        at += 1 if refused else 1 + len(pts)
    return done, answers


def _calls() -> list[Call]:
    """RFC 7748's vectors, the edge coordinates in one batch, each point of small order in a batch, and about
    3,800 seeded random points in calls of 1 to 24 points and a few large ones (every padding)."""
    rng = np.random.default_rng(2026)
    key = rng.bytes(32)
    calls: list[Call] = [(bytes.fromhex(k), bytes.fromhex(u)) for k, u, _ in RFC_7748_VECTORS]
    calls.append((key, b"".join(v.to_bytes(32, "little") for v in EDGE_U)))
    calls += [(key, rng.bytes(96) + v.to_bytes(32, "little") + rng.bytes(32 * 5)) for v in small_order_u()]
    calls.append((key, (P + 1).to_bytes(32, "little")))
    calls += [(rng.bytes(32), rng.bytes(32 * (1 + i % 24))) for i in range(96)]
    calls += [(rng.bytes(32), rng.bytes(32 * n)) for n in (512, 513, 519, 1023)]
    return calls


def test_the_sanitized_kernel_gives_openssls_bytes_and_no_report(toolchain: tuple[str, str], tmp_path: Path) -> None:
    cc, runtime = toolchain
    # -O1 as the sanitizers advise: they check the source's operations at any level, and -O3 with them takes
    # many times as long to compile.
    build(cc, SOURCE, tmp_path, "-O1")
    calls = _calls()
    done, answers = run(runtime, tmp_path, calls)
    assert done.returncode == 0 and "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, \
        done.stderr[-4000:]
    want = openssl(calls)
    assert answers == want
    assert all(answers[i] == bytes.fromhex(out) for i, (_, _, out) in enumerate(RFC_7748_VECTORS))
    assert sum(a is None for a in answers) == 6 and sum(len(p) for _, p in calls) // 32 > 3000


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_a_planted_bug_is_reported(toolchain: tuple[str, str], tmp_path: Path, planted: str) -> None:
    # What the test above would see of a real one: the sanitizer stops the run and names it.
    cc, runtime = toolchain
    prefix, report = PLANTED[planted]
    source = tmp_path / "planted.c"
    source.write_text(f'{prefix}#include "{SOURCE.name}"\n')
    build(cc, source, tmp_path, "-O1")
    done, _ = run(runtime, tmp_path, [(bytes(32), (9).to_bytes(32, "little"))])
    assert done.returncode != 0 and report in done.stderr, done.stderr[-4000:]
