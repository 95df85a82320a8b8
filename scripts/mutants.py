"""Deliberately broken variants of the row cache's hit path, each of which its guards must catch:

    python scripts/mutants.py [--out bench/results/cache-guards]

For every mutant it edits one line of the source in place (the text must occur exactly once),
runs the tests that guard it, puts the source back, and records whether the tests failed (the
mutant was caught). It exits non-zero when a mutant survives. Run it from the repository root
with no other build running; it takes a few minutes (each mutant is a rebuild). Not part of the
test suite: it is how a change to the hit path shows that its tests can still fail.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROW_CACHE = Path("crates/nearrec-cache/src/row_cache")
TIER_SOURCE = Path("crates/nearrec-engine/src/ssd.rs")
KERNELS = Path("crates/nearrec-kernels/src/fast")
CACHE_TESTS = ["cargo", "test", "--offline", "-q", "-p", "nearrec-cache", "--test", "caches"]
ENGINE_TESTS = ["cargo", "test", "--offline", "-q", "-p", "nearrec-engine", "--test", "tiers"]
DELTA_TESTS = ["cargo", "test", "--offline", "-q", "-p", "nearrec-engine", "--test", "delta"]
KERNEL_TESTS = ["cargo", "test", "--offline", "-q", "-p", "nearrec-kernels", "--test", "parity"]
# how a row's key is made and undone
KEY_OF = ("    row.wrapping_add(2)\n}\n\n/// The row whose key is `key` (not [`EMPTY`]).\n"
          "fn row_of(key: u64) -> u64 {\n    key - 2\n}")
# how a hit on the read path marks its slot
HIT_MARK = "mark::<LFU>(stamp, c.clock(RowCache::order_of(slot, ways, ways_shift)));"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: Path
    old: str
    new: str
    tests: list[str]


MUTANTS = [
    Mutant("an offer writes while readers hold the cache (nothing kept aside)", ROW_CACHE,
           "            Err(TryLockError::WouldBlock) => {\n                if self.defer(",
           "            Err(TryLockError::WouldBlock) => "
           "return self.offer_now(&mut 0, row, bytes),\n"
           "            #[allow(unreachable_patterns)]\n"
           "            Err(TryLockError::WouldBlock) => {\n                if self.defer(",
           CACHE_TESTS),
    Mutant("rows kept aside are dropped, never written", ROW_CACHE,
           "            self.offer_now(draws, row, bytes);\n",
           "            let _ = (row, bytes);\n", CACHE_TESTS),
    Mutant("the last reader out leaves the rows kept aside unwritten", ROW_CACHE,
           "        // the last reader out writes the rows kept aside while it read\n"
           "        self.cache.settle();", "", CACHE_TESTS),
    Mutant("read takes the row of whatever key holds the tagged slot", ROW_CACHE,
           "if stored.load(Ordering::Relaxed) != key_of(row) {", "if false {", CACHE_TESTS),
    Mutant("keys are row + 1, so a padding lookup's key is an empty slot's", ROW_CACHE,
           KEY_OF, KEY_OF.replace("add(2)", "add(1)").replace("key - 2", "key - 1"),
           CACHE_TESTS),
    Mutant("replace reports the row replaced without writing it (a stale row kept)", ROW_CACHE,
           "way.inspect(|&way| self.write(set, way, key_of(row), set.tag(), bytes))",
           "way.inspect(|&way| drop(way))", CACHE_TESTS),
    Mutant("the 16-way tag compare (SSE2) finds empty ways instead of the row's", ROW_CACHE,
           "_mm_cvtsi64_si128(set.0 as i64)", "_mm_cvtsi64_si128(0)", CACHE_TESTS),
    Mutant("the 8-way tag compare (SWAR) finds empty ways instead of the row's", ROW_CACHE,
           "let mut x = unsafe { tags.add(w).read() } ^ wanted;",
           "let mut x = unsafe { tags.add(w).read() };", CACHE_TESTS),
    Mutant("an LRU hit does not move the row to most recent", ROW_CACHE,
           HIT_MARK, f"if LFU {{ {HIT_MARK} }}", CACHE_TESTS),
    Mutant("an LFU hit is not counted", ROW_CACHE,
           HIT_MARK, f"if !LFU {{ {HIT_MARK} }}", CACHE_TESTS),
    Mutant("a cache hit overwrites what the patch found", TIER_SOURCE,
           "                    slots[i] = Slot::NONE;\n", "", DELTA_TESTS),
    Mutant("the admission draw ignores the probability", ROW_CACHE,
           "if draw >= self.admit_below {", "if draw >= u64::MAX {", CACHE_TESTS),
    Mutant("the admission draws repeat (the count never moves)", ROW_CACHE,
           "*draws += 1;", "*draws += 0;", CACHE_TESTS),
    Mutant("the tier source probes the hot partition for the next lookup's row", TIER_SOURCE,
           ".and_then(|home| hot.get_prefetched(home, run.rows[i]))",
           ".and_then(|home| hot.get_prefetched(home, run.rows[(i + 1) % n]))",
           ENGINE_TESTS),
    Mutant("a located run keeps its rows out of order", TIER_SOURCE,
           "run.rows[..n].copy_from_slice(&rows[..n]);",
           "run.rows[..n].copy_from_slice(&rows[..n]);\n        run.rows[..n].reverse();",
           ENGINE_TESTS),
    Mutant("the kernel pools a bag's share of a run one position off", KERNELS,
           "let (base, from) = (run.first, pos - run.first);",
           "let (base, from) = (run.first, pos + 1 - run.first);", KERNEL_TESTS),
    Mutant("the kernel's runs skip a lookup between them", KERNELS,
           "(self.first, self.len) = (pos, len);", "(self.first, self.len) = (pos, len + 1);",
           KERNEL_TESTS),
    Mutant("the kernel takes a run's bad index as a row", KERNELS,
           "bad |= value >= rows;", "bad |= false;", KERNEL_TESTS),
]


def holding(m: Mutant) -> Path:
    """The file of ``m.path`` (a file, or a module's folder) that holds ``m.old`` once."""
    files = sorted(m.path.glob("*.rs")) if m.path.is_dir() else [m.path]
    found = [(f, f.read_text().count(m.old)) for f in files]
    if [n for _, n in found if n] != [1]:
        raise SystemExit(f"{m.name}: {m.old!r} occurs {[n for _, n in found]} times in {files}")
    return next(f for f, n in found if n)


def run(m: Mutant) -> dict[str, Any]:
    path = holding(m)
    src = path.read_text()
    start = time.monotonic()
    try:
        path.write_text(src.replace(m.old, m.new))
        done = subprocess.run(m.tests, capture_output=True, text=True)
    finally:
        path.write_text(src)
    failed = [line.split(" ---")[0].strip() for line in done.stdout.splitlines()
              if line.endswith("--- FAILED")]
    built = "error[" not in done.stderr
    return {"mutant": m.name, "file": str(path), "tests": " ".join(m.tests), "built": built,
            "caught": done.returncode != 0 and built, "failed_tests": failed,
            "seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/cache-guards"))
    args = p.parse_args()
    results = []
    for m in MUTANTS:
        r = run(m)
        results.append(r)
        print(f"{'caught ' if r['caught'] else 'SURVIVED'} {m.name}: {r['failed_tests']}",
              flush=True)
    command = " ".join(["python", *sys.argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"command": command, "mutants": results}, indent=2) + "\n")
    lines = [f"<!-- produced by: {command} -->", "# The hit path's guards against broken variants",
             "", f"Command: `{command}`. Each mutant is one edit of the source; caught: its "
             "tests failed.", "", "| mutant | file | caught | tests that failed |",
             "|---|---|---|---|"]
    lines += [f"| {r['mutant']} | `{r['file']}` | {'yes' if r['caught'] else '**no**'} | "
              f"{', '.join(r['failed_tests']) or '—'} |" for r in results]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if not all(r["caught"] for r in results):
        raise SystemExit("a mutant survived its tests")


if __name__ == "__main__":
    main()
