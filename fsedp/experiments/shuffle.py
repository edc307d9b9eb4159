"""``fsedp shuffle``: Speculative MoE on a routing trace -- prediction accuracy, local
activation rate and all-to-all volume, with CEM co-clustering against METIS and balanced
k-means (``docs/speculative.md``)."""

import time

import numpy as np

from fsedp.errors import InputError
from fsedp.sw.policies.speculative import (
    DeviceBigram,
    TokenTable,
    cem_placement,
    comm_volume,
    kmeans_placement,
    lar,
    metis_placement,
    precision_f1,
    predicted_devices,
)
from fsedp.trace import RoutingTrace

__all__ = ["evaluate", "ci95", "format_report"]

#: Student's t at 97.5 % for 1..30 degrees of freedom (two-sided 95 % intervals); 1.96 beyond
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def ci95(values) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided 95 % confidence interval (Student's t over
    the values, taken as independent samples); ``None`` for a single value."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), None
    t = T975[len(x) - 2] if len(x) - 1 <= len(T975) else 1.96
    return float(x.mean()), float(t * x.std(ddof=1) / np.sqrt(len(x)))


#: the per-method figures that vary with the seed, averaged with intervals by :func:`evaluate`
SEEDED = ("lar", "lar_fit", "vectors_per_token", "vectors_per_token_dedup")


def evaluate(
    trace: RoutingTrace,
    devices: int = 4,
    fit: float = 0.2,
    slack: float = 0.1,
    cem_iters: int = 30,
    cem_samples: int = 64,
    elite: float = 0.1,
    seed: int = 0,
    embeddings=None,
    methods=("cem", "metis", "kmeans"),
    seeds=None,
) -> dict:
    """Prediction precision, EP's figures and each placement method's, on ``trace`` fitted on
    its first ``fit`` share.  With ``seeds`` (default: ``seed`` alone) CEM and k-means run
    once per seed (their samples and start change; the tables, the split and METIS do
    not): each method's figures are means with a 95 % interval (``<name>_ci``), and
    ``margin`` is CEM's LAR over the best other method's, per seed, as a mean and interval
    (``None`` without CEM and another)."""
    seeds = [seed] if seeds is None else list(seeds)
    if trace.token_ids is None:
        raise InputError(
            trace.name, "token_ids", "Speculative MoE needs the tokens' vocabulary ids"
        )
    if trace.num_experts % devices:
        raise InputError(
            trace.name,
            "--devices",
            f"{trace.num_experts} experts do not split evenly over {devices} devices",
        )
    if trace.tokens < 2:
        # the tables and placements are fitted on at least one token and measured on the
        # rest: one token leaves nothing to measure (every figure would be 0 / 0)
        raise InputError(
            trace.name,
            "experts",
            f"{trace.tokens} token: Speculative MoE fits its tables and placements on the "
            "first --fit share of the tokens (at least one) and measures them on the rest, so "
            "a trace needs at least 2 tokens",
        )
    n_fit = max(1, int(trace.tokens * fit))
    ids = trace.token_ids.astype(np.int64)
    e = trace.experts.astype(np.int64)
    k, E, L = trace.top_k, trace.num_experts, trace.layers
    table = TokenTable(ids[:n_fit], e[:n_fit], E, embeddings)
    test_ids, test_e = ids[n_fit:], e[n_fit:]
    _, seen = table.rows(test_ids)
    out = {
        "trace": trace.name,
        "tokens": trace.tokens,
        "fit_tokens": n_fit,
        "devices": devices,
        "experts": E,
        "top_k": k,
        "layers": L,
        "seen": round(float(seen.mean()), 4),
        "prediction": [],
        "methods": {},
    }
    for l in range(L):
        p, f1 = precision_f1(table.predict(l, test_ids, k), test_e[:, l])
        pop = np.argsort(-table.pop[l], kind="stable")[:k]
        pp, _ = precision_f1(np.tile(pop, (len(test_e), 1)), test_e[:, l])
        out["prediction"].append(
            {
                "layer": l,
                "precision": round(p, 4),
                "f1": round(f1, 4),
                "popularity_precision": round(pp, 4),
            }
        )
    rows_fit, _ = table.rows(ids[:n_fit])
    V = len(table.vocab)
    ep_dev = np.arange(E) % devices
    base = {"lar": [], "vol": []}
    for l in range(L):
        base["lar"].append(lar(np.arange(len(test_e)) % devices, ep_dev, test_e[:, l]))
        base["vol"].append(
            comm_volume(test_e[:, l], ep_dev, np.arange(len(test_e)) % devices, devices, 1.0)
        )
    out["ep"] = {
        "lar": round(float(np.mean(base["lar"])), 4),
        "vectors_per_token": round(float(np.mean([v["ep"] for v in base["vol"]])), 4),
        "vectors_per_token_dedup": round(float(np.mean([v["ep_dedup"] for v in base["vol"]])), 4),
    }
    # the token-expert affinities of the fitting tokens, per layer
    affs = []
    for l in range(L):
        aff = np.zeros((V, E))
        np.add.at(aff, (np.repeat(rows_fit, k), e[:n_fit, l].reshape(-1)), 1)
        affs.append(aff)

    def place(m: str, seed: int) -> dict:
        t0 = time.time()
        lars, vols, fit_lars, bigram_acc = [], [], [], []
        devseq = np.zeros((len(test_e), L), dtype=np.int64)
        for l, aff in enumerate(affs):
            if m == "cem":
                dev, tok, val, _ = cem_placement(
                    aff, devices, cem_iters, cem_samples, elite, slack=slack, seed=seed + l
                )
            elif m == "metis":
                dev, tok, val = metis_placement(aff, devices, slack)
            else:
                dev, tok, val = kmeans_placement(aff, devices, slack=slack, seed=seed + l)
            pred = predicted_devices(table, tok, test_ids, devices)
            lars.append(lar(pred, dev, test_e[:, l]))
            fit_lars.append(val)
            vols.append(comm_volume(test_e[:, l], dev, pred, devices, 1.0))
            devseq[:, l] = dev[test_e[:, l, 0]]
        if L >= 3:
            half = len(devseq) // 2
            bigram_acc = DeviceBigram(devseq[:half], devices).accuracy(devseq[half:])
        return {
            "lar": round(float(np.mean(lars)), 4),
            "lar_fit": round(float(np.mean(fit_lars)), 4),
            "vectors_per_token": round(float(np.mean([v["smoe"] for v in vols])), 4),
            "vectors_per_token_dedup": round(float(np.mean([v["smoe_dedup"] for v in vols])), 4),
            "shuffled": round(float(np.mean([v["shuffle"] for v in vols])), 4),
            "device_bigram_accuracy": round(float(np.mean(bigram_acc)), 4) if bigram_acc else None,
            "seconds": round(time.time() - t0, 1),
        }

    # per method, one row per seed (METIS once: it does not depend on the seed)
    runs = {
        m: [place(m, s) for s in seeds] if m != "metis" else [place(m, seeds[0])] * len(seeds)
        for m in methods
    }
    out["seeds"] = seeds
    for m, rows in runs.items():
        row = dict(rows[0])
        for key in SEEDED + ("device_bigram_accuracy",):
            if row[key] is None:  # no 2-gram below three layers
                continue
            mean, half = ci95([r[key] for r in rows])
            row[key] = round(mean, 4)
            row[f"{key}_ci"] = round(half, 4) if half is not None else None
        row["seconds"] = round(sum(r["seconds"] for r in (rows[:1] if m == "metis" else rows)), 1)
        out["methods"][m] = row
    others = [m for m in methods if m != "cem"]
    out["margin"] = None
    # a ratio needs the other placements to keep some activations local (LAR > 0)
    best_other = [max((runs[m][i]["lar"] for m in others), default=0.0) for i in range(len(seeds))]
    if "cem" in methods and min(best_other) > 0:
        per = [runs["cem"][i]["lar"] / best_other[i] - 1 for i in range(len(seeds))]
        mean, half = ci95(per)
        best = max(others, key=lambda m: out["methods"][m]["lar"])
        out["margin"] = {
            "over": best,
            "lar": round(mean, 4),
            "ci": round(half, 4) if half is not None else None,
        }
    return out


def format_report(r: dict) -> str:
    pr = r["prediction"]
    lines = [
        f"# Speculative MoE on {r['trace']}: {r['tokens']} tokens, top-{r['top_k']} of "
        f"{r['experts']} experts, {r['layers']} layers, {r['devices']} devices",
        "",
        f"Fitted on the first {r['fit_tokens']} tokens, evaluated on the rest "
        f"({r['seen'] * 100:.1f} % of their ids seen).",
        "",
        "| layer | token-id precision | F1 | popularity precision |",
        "|---:|---:|---:|---:|",
    ]
    for p in pr:
        lines.append(
            f"| {p['layer']} | {p['precision']} | {p['f1']} | {p['popularity_precision']} |"
        )
    ep = r["ep"]
    lines += [
        "",
        "| placement | LAR (eval) | LAR (fit) | vectors/token (dispatch + combine) | with de-dup | "
        "saved vs EP (de-dup) | device 2-gram accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| DeepSpeed-MoE EP (expert e on device e mod D, token i on i mod D) | {ep['lar']} | - | "
        f"{ep['vectors_per_token']} | {ep['vectors_per_token_dedup']} | - | - |",
    ]

    def pm(v, key):
        half = v.get(f"{key}_ci")
        return f"{v[key]}" if half is None else f"{v[key]} ± {half}"

    for m, v in r["methods"].items():
        # one device: EP sends nothing, so there is nothing to save
        base = ep["vectors_per_token_dedup"]
        saved = f"{(1 - v['vectors_per_token_dedup'] / base) * 100:.1f} %" if base else "-"
        lines.append(
            f"| s-MoE, {m} | {pm(v, 'lar')} | {pm(v, 'lar_fit')} | "
            f"{pm(v, 'vectors_per_token')} | {pm(v, 'vectors_per_token_dedup')} | "
            f"{saved} | {v['device_bigram_accuracy']} |"
        )
    if r.get("seeds"):
        lines += ["", f"Means over seeds {r['seeds']}, ± the half-width of a 95 % interval."]
    mg = r.get("margin")
    if mg:
        ci = f" ± {mg['ci'] * 100:.1f}" if mg["ci"] is not None else ""
        lines += [
            "",
            f"CEM's LAR over the best other placement ({mg['over']}): "
            f"{mg['lar'] * 100:+.1f}{ci} % (the paper: +14.2 % over METIS).",
        ]
    return "\n".join(lines) + "\n"
