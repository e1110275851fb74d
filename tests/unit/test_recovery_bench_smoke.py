"""``bench/recovery.py --quick``: it ends within its run's timeout (its time is printed, not
asserted: these machines are shared), prints a row for every policy at every failure size, and
every row ECRM decoded is the lost one (the goals' outcomes are the full run's business, not
this test's)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("full", "partial (naive)", "cpr-vanilla", "cpr-mfu", "cpr-ssu", "ecrm k=2", "ecrm k=4")
SIZES = {"12.5%": 8, "25%": 4, "50%": 2}

pytestmark = pytest.mark.slow  # about 30 s on 2 cores


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, float]:
    work = tmp_path_factory.mktemp("recovery")
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "recovery.py"), "--quick", "--work-dir", str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - started
    print(f"\nbench/recovery.py --quick: {elapsed:.1f} s")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: some goal not met
    return proc.stdout, elapsed


def section(out: str, title: str) -> list[str]:
    start = out.index(f"== {title}")
    end = out.find("\n== ", start + 3)
    return out[start : end if end > 0 else None].splitlines()


def row_of(lines: list[str], label: str, size: str) -> str | None:
    """A table's row for ``label`` (a policy or variant) at failure size ``size``."""
    pattern = re.compile(rf"^{re.escape(label)}\s+{re.escape(size)}\s")
    return next((line for line in lines if pattern.match(line)), None)


def test_table_has_every_policy_at_every_failure_size(quick_run: tuple[str, float]) -> None:
    lines = section(quick_run[0], "Overhead, accuracy and PLS")
    for policy in POLICIES:
        for size, num_ps in SIZES.items():
            row = row_of(lines, policy, size)
            assert row is not None, f"no row for {policy} at {size}"
            cells = row[len(policy) :].split()
            assert cells[1] == str(num_ps)
            k = int(policy[-1]) if policy.startswith("ecrm") else 0
            if k and num_ps < k + 1:
                assert f"needs k+1 = {k + 1} PS" in row
                continue
            overhead, _, _, auc_delta, pls = cells[2], cells[3], cells[4], cells[5], cells[6]
            assert overhead.endswith("%") and float(overhead[:-1]) >= 0
            assert abs(float(auc_delta)) < 0.05 and 0 <= float(pls) <= 1
            if policy in ("full",) or policy.startswith("ecrm"):
                assert float(pls) == 0.0
            if policy == "full":  # a rollback retrains exactly what was lost
                assert float(auc_delta) == 0.0


def test_ecrm_decodes_exactly_the_lost_rows(quick_run: tuple[str, float]) -> None:
    lines = section(quick_run[0], "ECRM: each failure's rebuild")
    rows = [line for line in lines if line.startswith("ecrm k=")]
    assert len(rows) == 6  # 2 failures x (k=2 at 8 and 4 PS, k=4 at 8 PS)
    for row in rows:
        cells = row.split()
        decoded, exact, max_err, ok = int(cells[5]), cells[6], float(cells[7]), cells[8]
        done, total = map(int, exact.split("/"))
        assert decoded > 0 and total > 0
        assert ok == "yes" and max_err <= 1e-6
        assert done >= total - total // 1000  # float64 parity: bit for bit in (almost) all


def test_costs_and_goals_are_printed(quick_run: tuple[str, float]) -> None:
    out = quick_run[0]
    costs = section(out, "Measured costs")
    assert sum(1 for line in costs if re.match(r"^(12\.5|25|50)%\s", line)) == 3
    goals = [g for g in section(out, "Goals")[1:] if g.strip() and not g.startswith("(")]
    # per size: CPR's bound x3, vs vanilla x2, AUC x2; 90% below full x2 at 12.5% and 25%;
    # ECRM (k, size) x2
    assert len(goals) == 3 * (3 + 2 + 2) + 2 * 2 + 3 * 2
    assert all(re.match(r"^(MET|NOT MET) ", g) for g in goals)
    assert re.search(r"^\(seed 0, quick run, [\d.]+ s\)$", out, flags=re.M)


def test_partial_saves_scale_with_their_rows_and_restores_read_about_one_table(
    quick_run: tuple[str, float],
) -> None:
    """Per failure size: each CPR variant against the model bound; an MFU/SSU save writes
    about r = 1/8 of a full save's bytes, and a restore reads at most about one table (the
    folded chain: base, slack 1/4, the newest save), not the whole chain. A run whose measured
    costs failed CPR's benefit check recovered as ``full`` does and saved no partial: its row
    says so in the overview."""
    lines = section(quick_run[0], "CPR against its model bound")
    overview = section(quick_run[0], "Overhead, accuracy and PLS")
    for variant in ("cpr-vanilla", "cpr-mfu", "cpr-ssu"):
        for size in SIZES:
            row = row_of(lines, variant, size)
            assert row is not None, f"no row for {variant} at {size}"
            cells = row.split()
            of_bound = float(cells[5])
            assert -100 < of_bound < 2
            if variant == "cpr-vanilla":
                continue
            if cells[7] == "-":
                fell_back = row_of(overview, variant, size)
                assert fell_back is not None and "fell back to full recovery" in fell_back, row
                continue
            save_share, restore_share = float(cells[7]), float(cells[8])
            assert 0 < save_share <= 0.125 * 1.2, row
            assert 0 < restore_share <= 1.0 + 0.25 + 0.125 + 0.1, row
