"""The report of a sweep over runs: one results table, pooled paired differences, each run's controller path.

Pairs are (run, track): a run's trained system − its own SFT, and two methods' runs of one seed against each other;
pooled with a Student-t interval and the minimum detectable difference. Scores 0–1, printed 0–100.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from bat_jax.benchmark.scoring import display, half_width, min_detectable_difference, paired_comparison
from bat_jax.report import mde_words, results_table, summary_from_dict


def _trained(final: Mapping) -> str | None:
    """The run's trained system: its last one that is neither 'untrained' nor 'SFT'."""
    names = [k for k in final if k not in ("untrained", "SFT")]
    return names[-1] if names else None


def pooled_line(label: str, pairs: Sequence[float], confidence: float = 0.95) -> str:
    """'label: mean ± half-width over n pairs; MDE words' on the 0–100 scale (n < 2: no interval)."""
    if not pairs:
        return f"  {label}: no pairs"
    mean = statistics.fmean(pairs)
    hw = half_width(pairs, confidence)
    verdict = ("interval excludes 0" if len(pairs) > 1 and abs(mean) > hw else "interval includes 0")
    return (f"  {label}: {display(mean)} ± {100 * hw:.1f} over {len(pairs)} (run, track) pairs, {verdict}; "
            f"{mde_words(mean, min_detectable_difference(pairs, confidence), confidence=confidence)}")


def controller_line(name: str, summary: Mapping) -> str | None:
    """A run's controller Overall per round with each round's target stage and decision, or None when not recorded."""
    path = summary.get("controller")
    if not path:
        return None
    steps = [display(path[0]["overall"])]
    steps += [f"{display(r['overall'])} ({r['target']}, {r['decision']})" for r in path[1:]]
    return f"  {name}: " + " → ".join(steps)


def sweep_report(runs: Sequence[tuple[str, Mapping]], confidence: float = 0.95,
                 groups: Mapping[str, str] | None = None, seeds: Mapping[str, int] | None = None) -> str:
    """One Table-2-style table over the runs of a sweep, then the paired differences.

    Args:
      runs: (entry name, that run's summary.json dict) in sweep order.
      confidence: of the Student-t half-widths.
      groups: entry name -> group (e.g. the seeds of one method); None or an entry left out = the group ''.
      seeds: entry name -> seed; runs of two groups with the same seed are paired track by track.
    Returns the text: every system of every run as one row 'entry: system'; per run, its trained system − its SFT;
    per group, that difference pooled over its (run, track) pairs; SFT − untrained pooled over one run per seed;
    for every two groups (in order of first appearance), group A − group B over the seeds both ran; each run's
    controller Overall per round.
    """
    groups, seeds = dict(groups or {}), dict(seeds or {})
    rows, lines, pooled, base, by_seed = [], [], {}, {}, {}
    for name, summary in runs:
        final = {k: summary_from_dict(v) for k, v in summary.get("final", {}).items()}
        rows += [(f"{name}: {system}", s) for system, s in final.items()]
        group, trained = groups.get(name, ""), _trained(final)
        if "SFT" in final and "untrained" in final:
            base.setdefault(seeds.get(name, name), paired_comparison(final["SFT"], final["untrained"]))
        if trained and "SFT" in final:
            cmp = paired_comparison(final[trained], final["SFT"], "overall")
            pooled.setdefault(group, []).extend(cmp.per_track.values())
            lines.append(f"  {name}: {trained} − SFT = {display(cmp.mean_diff)} ± {100 * cmp.half_width:.1f} "
                         f"({len(cmp.per_track)} tracks); {mde_words(cmp.mean_diff, cmp.mde)}")
            if name in seeds:
                by_seed.setdefault(group, {})[seeds[name]] = final[trained]
    text = ["```", results_table(rows), "```", "", "Trained system − SFT, paired over tracks (Overall, 0–100):",
            *lines, "", f"Pooled paired differences (Overall, 0–100; {100 * confidence:.0f} % intervals):"]
    text.append(pooled_line("SFT − untrained (one run per seed)",
                            [d for cmp in base.values() for d in cmp.per_track.values()], confidence))
    for group, pairs in pooled.items():
        text.append(pooled_line(f"{group or 'trained'} − SFT", pairs, confidence))
    names = list(by_seed)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(by_seed[a]) & set(by_seed[b]))
            pairs = [d for s in shared for d in paired_comparison(by_seed[a][s], by_seed[b][s]).per_track.values()]
            if pairs:
                text.append(pooled_line(f"{a} − {b} (seeds {', '.join(map(str, shared))})", pairs, confidence))
    paths = [line for name, summary in runs if (line := controller_line(name, summary))]
    if paths:
        text += ["", "Controller Overall per round (0–100; round target and decision):", *paths]
    return "\n".join(text) + "\n"
