"""`specrt plan-tree`: a draft tree sized for this device (runtime.tree_plan), as a plan file: a static
shape (--tree static), or the parameters of EAGLE-2's dynamic tree (--tree dynamic).

Three steps, each an API call: (a) the method decodes --images images through the public
Pipeline with a wide probe tree (static: runtime.tree_plan.fan_paths; dynamic: a dynamic tree of
probe width × depth nodes, top-k = the width, whose children are point masses and so accepted at
other rates than sampled ones: each kind is measured as it is drafted), and every round's verification
outcome is counted by depth and sibling rank (runtime.methods.tree_loop.observing_trees); (b) the bundle's
own runners time a target step for every window 1..max_nodes + 1 and a draft pass for every
width, plus the draft_chain calls the draft has (fastest of --repeats, each call timed warm,
right after an untimed run of itself: bench.cost_model._interleaved_best); (c) runtime.tree_plan.make_plan solves and the plan is
written atomically. `static_tree=PLAN.json` (generate --param, bench --sweep, Python) then uses it.
The models come as `specrt bench` opens them (bench.models.open_models): a BUNDLE with its own
draft, or the embedded demo with --draft independent (its draft GPT) or eagle (its EAGLE head).
"""
from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.threads import checked as checked_threads
from specrt.runtime.tree_plan_file import TREE_KINDS

METHODS = ("sd", "cool-sd", "lantern")  # the drafted methods with tree=static
DRAFT_KINDS = ("independent", "eagle")
# plan-tree sets these itself: the probe tree, then the planned one
TREE_KEYS = ("tree", "static_tree", "total_tokens", "depth", "tree_top_k", "draft_len")
PROBE_SEED = 1000  # not the bench's seeds (0, 1, ...): a plan is judged on images it was not made from
SHOWN_DEPTHS = 6  # the summary's a_0(d), d = 1..6 (the probe's default depth)
CHAIN_DRAFTS_MAX = 16  # the longest chain whose draft_chain call is timed (where the runner chains any count)


@click.command(name="plan-tree")
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--method", "-m", type=click.Choice(METHODS), default="sd", show_default=True,
              help="The drafted method the tree is for (its acceptance decides the tree).")
@click.option("--tree", "tree_kind", type=click.Choice(TREE_KINDS), default="static", show_default=True,
              help="What to size: a static shape (static_tree=PLAN.json) or EAGLE-2's dynamic tree "
                   "(total_tokens, depth, tree_top_k).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Method or sampling parameter, as generate's (e.g. relaxation_budget=2); not the tree's own.")
@click.option("--draft", "draft_kind", type=click.Choice(DRAFT_KINDS), default=None,
              help="Embedded demo: its draft GPT (independent, default) or its EAGLE head. A BUNDLE drafts with its own.")
@click.option("--backend", type=click.Choice(["ort", "ort-cpu", "ort-cuda", "ort-trt", "trt", "torch"]), default="ort",
              show_default=True, help="Where the plan is measured (and meant to run); torch: the demo's PyTorch modules.")
@click.option("--device", default="cpu", show_default=True, help="torch device for --backend torch (cpu, cuda, cuda:N).")
@click.option("--images", type=int, default=48, show_default=True,
              help="Images decoded with the probe tree to measure sibling acceptance (classes cycle); the "
                   "rates vary from image to image, so fewer than a few dozen leave a_0 a few points off.")
@click.option("--max-nodes", type=int, default=64, show_default=True,
              help="Largest tree considered (drafts; at most the bundle's max_window − 1).")
@click.option("--max-depth", type=int, default=None, help="Deepest tree considered (default: no limit).")
@click.option("--probe-width", type=int, default=8, show_default=True,
              help="Probe tree: children tried per node (the sibling ranks measured).")
@click.option("--probe-depth", type=int, default=6, show_default=True,
              help="Probe tree: levels (width × depth nodes, within the bundle's max_window − 1).")
@click.option("--repeats", type=int, default=11, show_default=True, help="Timed rounds per window (the fastest counts).")
@click.option("--seed", type=int, default=PROBE_SEED, show_default=True,
              help="Seed of probe image 0 (image i: seed + i); not bench's 0, so a plan is judged on other images.")
@click.option("--threads", type=int, default=1, show_default=True, callback=checked_threads, help="CPU threads per model call.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the exported demo bundle is kept (as specrt bench's).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("tree-plan.json"),
              show_default=True, help="Plan file to write (JSON; use it as static_tree=PATH).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on stderr.")
def command(bundle, method, tree_kind, params, draft_kind, backend, device, images, max_nodes, max_depth, probe_width,
            probe_depth, repeats, seed, threads, cache_dir, out, progress) -> None:
    """Measure sibling acceptance and step latencies, and write the tree that drafts the most tokens
    per second here (Sequoia's hardware-aware tree; with --tree dynamic, EAGLE-2's parameters), with
    its predicted speed-up."""
    from specrt.commands.generate import parse_params
    from specrt.paths import cache_folder, output_file

    output_file("--out", out)
    images = validation.count("--images", images)
    max_nodes = validation.count("--max-nodes", max_nodes)
    if max_depth is not None:
        max_depth = validation.count("--max-depth", max_depth)
    probe_width = validation.count("--probe-width", probe_width)
    probe_depth = validation.count("--probe-depth", probe_depth)
    repeats = validation.count("--repeats", repeats)
    threads = validation.threads("--threads", threads)
    validation.seed(seed, "--seed")
    method_params = parse_params(params)
    fixed = sorted(set(method_params) & set(TREE_KEYS))
    if fixed:
        raise SpecrtError(f"--param {fixed[0]}: plan-tree chooses the tree itself (drop {', '.join(fixed)})")
    _check_method(method, method_params, tree_kind)
    if bundle is not None and draft_kind is not None:
        raise SpecrtError("--draft picks the embedded demo's draft; a BUNDLE drafts with its own (export --eagle for a head)")
    if backend != "torch" and device.strip().lower() != "cpu":
        raise SpecrtError(f"--device {device} applies to --backend torch; --backend {backend} picks its device itself")
    device = validation.torch_device(device)
    cache_dir = cache_folder("--cache-dir", cache_dir)
    say = (lambda msg: click.echo(msg, err=True)) if progress else None

    from specrt.bench.models import open_models, refuse_torch_bundle

    refuse_torch_bundle(bundle, backend)
    kind = draft_kind or "independent"
    models = open_models(bundle, backend, None, threads, cache_dir, judge=False, progress=say, device=device,
                         cuda_graphs=device.startswith("cuda"), drafts=() if bundle is not None else (kind,))
    pipe = models.drafts.get(kind, models.pipeline)
    if pipe.draft is None:
        raise SpecrtError(f"{models.bundle} has no draft model: plan-tree plans the draft's tree (re-export with --draft "
                          f"or --eagle)")
    if pipe.target.spec.model_type != "c2i":
        raise SpecrtError("plan-tree probes class-conditional models (class ids); this model takes prompts")
    window = pipe.target.max_window
    max_nodes = min(max_nodes, window - 1)
    if probe_width * probe_depth > window - 1:
        raise SpecrtError(f"the probe tree (--probe-width {probe_width} × --probe-depth {probe_depth} = "
                          f"{probe_width * probe_depth} drafts) exceeds this model's max_window − 1 = {window - 1}")

    from specrt.bench.device import device_name
    from specrt.runtime.tree_acceptance import PRIOR_VISITS
    from specrt.runtime.tree_plan import chain_rate, make_plan
    from specrt.runtime.tree_plan_file import write_plan

    started = time.perf_counter()
    from specrt.runtime.methods import METHODS as ALL_METHODS

    draft_len = ALL_METHODS[method].PARAMS["draft_len"].default
    probed = probe(pipe, method, method_params, images, seed, probe_width, probe_depth, draft_len, progress,
                   tree_kind)
    acceptance = probed.counts.acceptance_by_depth()
    if not acceptance or not acceptance[0]:
        raise SpecrtError("the probe verified no tree round (images too short for a tree?)")
    latency = measure_latency(pipe, method_params, max_nodes, repeats, progress)
    latency.host_round, latency.host_node, latency.host_level = probed.host_round, probed.host_node, probed.host_level
    latency.host_chain, latency.host_ar = probed.host_chain, probed.host_ar
    drafter = "eagle" if latency.drafter == "eagle" else ("independent" if bundle is None else "model")
    measured_on = {"device": device_name(models.backend), "backend": models.backend, "threads": threads,
                   "bundle": models.bundle, "draft": drafter, "method": method, "params": method_params,
                   "images": images, "seed": seed, "rounds": probed.rounds,
                   "chain_check": {"draft_len": draft_len, "measured_tokens_per_round": round(probed.chain_tokens_per_round, 4)},
                   "probe": {"tree": tree_kind, "width": probe_width, "depth": probe_depth},
                   "acceptance_prior_visits": PRIOR_VISITS,
                   "max_nodes": max_nodes, "max_depth": max_depth, "seconds": round(time.perf_counter() - started, 1)}
    chain_acceptance = None
    if tree_kind == "dynamic":  # the probe's top-k rates are not a sampled chain's: its chain rounds say
        chain_acceptance = [chain_rate(probed.chain_tokens_per_round, draft_len)]
        measured_on["chain_check"]["chain_a0_solved"] = round(chain_acceptance[0], 4)
    plan = make_plan(acceptance, latency, max_nodes, max_depth, probed.counts, measured_on, default_draft_len=draft_len,
                     kind=tree_kind, chain_acceptance=chain_acceptance)
    write_plan(out, plan)
    _print_summary(plan, out, method)


def _check_method(method: str, method_params: dict[str, str], tree_kind: str = "static") -> None:
    """The method's and sampling parameters, checked before a model loads (as generate does)."""
    from specrt.runtime.methods import make_method
    from specrt.runtime.pipeline import SAMPLING_KEYS
    from specrt.runtime.sampling import SamplingParams

    SamplingParams(**{k: v for k, v in method_params.items() if k in SAMPLING_KEYS})
    make_method(method, tree=tree_kind, **{k: v for k, v in method_params.items() if k not in SAMPLING_KEYS})


def _bar(progress: bool, total: int, what: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=what, disable=not progress, dynamic_ncols=True, leave=False, mininterval=0.5)


@dataclass
class Probe:
    """What the decoding runs measured: sibling-rank counts from the probe tree, and host seconds
    (Python between the graph calls) per tree round (fixed, per node, per level), per chain round
    and per ar token; the chain's tokens per round, to set beside its prediction."""

    counts: Any
    rounds: int
    host_round: float
    host_node: float
    host_level: float
    host_chain: float
    host_ar: float
    chain_tokens_per_round: float


HOST_IMAGES = 8  # images per run that only measures host work (two small trees, the chain, ar)


def probe(pipe: Any, method: str, params: dict[str, str], images: int, seed: int, width: int, depth: int,
          default_draft_len: int, progress: bool = False, kind: str = "static") -> Probe:
    """Decode through Pipeline.generate, one image a call (the batch-1 rounds a plan is for), classes
    cycling and image i seeded seed + i: `images` images with the probe tree, whose rounds are
    counted by sibling rank (runtime.tree_acceptance.RankCounts); then a few with a one-node tree, a
    spine of `depth` nodes, the chain of default_draft_len (`images` of them for a dynamic plan: its
    chains are priced from these rounds, runtime.tree_plan.chain_rate) and ar, for host work. The trees are of
    `kind`: static (the fan, width x depth), or dynamic (width x depth nodes, `depth` passes, top-k
    `width`; the one-node and spine trees as dynamic trees of top-k 1), so the host work fitted is
    that kind's own (a dynamic tree also ranks its candidates every pass).
    Host seconds of a run are its total less its target and draft graph time; a tree round's are
    fitted as fixed + per node + per level (draft pass) through the three trees' (their nodes and
    levels per round as observed: trees shrink at an image's end). Each setting runs one untimed,
    unobserved image first (warm-up)."""
    from specrt.runtime.methods.tree_loop import observing_trees
    from specrt.runtime.pipeline import SAMPLING_KEYS
    from specrt.runtime.tree_acceptance import RankCounts
    from specrt.runtime.tree_plan import fan_paths
    from specrt.runtime.tree_plan_file import TreePlan, write_plan

    counts = RankCounts()
    classes = pipe.target.spec.num_classes
    few = min(images, HOST_IMAGES)
    chained = images if kind == "dynamic" else few  # dynamic: the chain's own rate is solved from its rounds
    bar = _bar(progress, images + 3 * few + chained + 4, "probe")

    def run(name: str, count: int, shape: Any = None, **kwargs: Any) -> tuple[float, float, float, list[float]]:
        """Host seconds, target forwards and tokens of `count` images (after an untimed one), and for
        a tree: rounds, nodes and levels observed (every round of the fan tree counted by rank)."""
        pipe.generate(class_ids=[0], method=name, seed=seed + 10**6, decode=False, **kwargs)
        host = forwards = tokens = 0.0
        seen = [0.0, 0.0, 0.0]

        def observe(trees, outcomes) -> None:
            for tree, outcome in zip(trees, outcomes):
                if tree is not None and outcome is not None:
                    if shape == "fan":
                        counts.add(tree.children, outcome.path)
                    seen[0] += 1
                    seen[1] += len(tree) - 1
                    seen[2] += len({tree.depths[n] for n, kids in enumerate(tree.children) if kids})
        with observing_trees(observe) if shape is not None else nullcontext():
            for i in range(count):
                result = pipe.generate(class_ids=[i % classes], method=name, seed=seed + i, decode=False, **kwargs)
                spent = result.stats.seconds
                host += spent["total"] - spent.get("target_forward", 0.0) - spent.get("draft_forward", 0.0)
                forwards += result.stats.target_forwards
                tokens += result.stats.tokens
                bar.update(1)
        return host, forwards, tokens, seen

    sampling = {k: v for k, v in params.items() if k in SAMPLING_KEYS}
    trees = {"fan": fan_paths(width, depth), "one": [[0]], "spine": [[0] * d for d in range(1, depth + 1)]}
    host: dict[str, tuple[float, float, float]] = {}  # shape -> host seconds per round, nodes, levels
    try:
        with tempfile.TemporaryDirectory(prefix="specrt-plan-") as folder:
            for shape, paths in trees.items():
                if kind == "dynamic":
                    top_k = width if shape == "fan" else 1
                    tree = dict(tree="dynamic", total_tokens=len(paths), depth=max(map(len, paths)), tree_top_k=top_k)
                else:
                    tree = dict(tree="static", static_tree=str(write_plan(Path(folder) / f"{shape}.json",
                                                                          TreePlan(paths, []))))
                spent, forwards, _, (rounds, nodes, levels) = run(method, images if shape == "fan" else few, shape,
                                                                  **tree, **params)
                host[shape] = (spent / max(forwards, 1), nodes / max(rounds, 1), levels / max(rounds, 1))
                if shape == "fan":
                    probe_rounds = int(rounds)
        chain_host, chain_rounds, chain_tokens, _ = run(method, chained, tree="chain",
                                                       draft_len=default_draft_len, **params)
        ar_host, ar_tokens, _, _ = run("ar", few, **sampling)
    finally:
        bar.close()
    fixed, per_node, per_level = _fit_host(list(host.values()))
    return Probe(counts, probe_rounds, fixed, per_node, per_level, chain_host / max(chain_rounds, 1),
                 ar_host / max(ar_tokens, 1), chain_tokens / max(chain_rounds, 1))


def _fit_host(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """(fixed, per node, per level) seconds through (host per round, nodes, levels) points, by least
    squares, none negative (a negative one is noise: set to 0 and the others fitted again)."""
    seconds = np.array([p[0] for p in points])
    design = np.array([[1.0, p[1], p[2]] for p in points])
    free = [0, 1, 2]
    while True:
        solution = np.zeros(3)
        solution[free] = np.linalg.lstsq(design[:, free], seconds, rcond=None)[0]
        negative = [i for i in free if solution[i] < 0]
        if not negative:
            return float(solution[0]), float(solution[1]), float(solution[2])
        free = [i for i in free if i not in negative]
        if not free:
            return 0.0, 0.0, 0.0


def measure_latency(pipe: Any, params: dict[str, str], max_nodes: int, repeats: int, progress: bool = False) -> Any:
    """runtime.tree_latency.Latency of `pipe`'s runners for one image at its sampling settings, after a
    half-full cache: target steps of 1..max_nodes + 1 tokens, draft passes of 1..max_nodes + 1
    (within the draft's window), and the draft_chain calls the draft can make (2 tokens fed first,
    a round's usual catch-up). Fastest of `repeats` rounds, each call timed warm
    (bench.cost_model._interleaved_best with warm=True)."""
    from specrt.bench.cost_model import _interleaved_best
    from specrt.runtime.eagle import HeadRunner
    from specrt.runtime.pipeline import SAMPLING_KEYS
    from specrt.runtime.sampling import SamplingParams, guidance_mix, needs_restriction
    from specrt.runtime.tree_latency import Latency, monotone

    target, draft = pipe.target, pipe.draft
    explicit = {k: v for k, v in params.items() if k in SAMPLING_KEYS}
    sampling = SamplingParams(**{**pipe.sampling_defaults, **explicit}).for_vocab(target.spec.vocab_size)
    mix = guidance_mix(1, sampling)
    conditions = pipe.conditions([0])
    rows = conditions.with_uncond(target.spec.null_class) if sampling.uses_cfg else conditions
    head = isinstance(draft, HeadRunner)
    half = target.spec.num_image_tokens // 2
    for runner in (target, draft):
        runner.allocate(mix)
        runner.reset_counters()
    target.prefill(rows, np.full((1, 1), 0.5))
    if head:
        draft.begin()
    else:
        draft.prefill(rows, np.full((1, 1), 0.5))
    pairs = draft.batch // draft.images

    def features(width: int) -> list[np.ndarray]:
        return [np.zeros((pairs, width, draft.dim), dtype=np.float32)]

    def step(runner: Any, width: int) -> Callable[[], Any]:
        ids, uniforms = np.zeros((1, width), dtype=np.int64), np.full((1, width), 0.5)
        if runner is draft and head:
            fed = features(width)
            return lambda: runner.step_pairs(ids, fed, uniforms)
        return lambda: runner.step(ids, uniforms)

    def chain(steps: int) -> Callable[[], Any]:
        ids, uniforms = np.zeros((1, 2), dtype=np.int64), np.full((1, steps), 0.5)
        if head:
            fed = features(2)
            return lambda: draft.chain_pairs(ids, fed, steps, uniforms)
        return lambda: draft.chain(ids, steps, uniforms)

    step(target, half)()  # half the image in both caches: a step's typical attention length
    target.commit(range(half))
    step(draft, half)()
    draft.commit(range(half))
    windows = list(range(1, min(max_nodes + 1, target.max_window) + 1))
    widths = list(range(1, min(max_nodes + 1, draft.max_window) + 1))
    chained = [] if needs_restriction(sampling) else \
        [k for k in range(1, min(max_nodes, CHAIN_DRAFTS_MAX, draft.max_window - 2) + 1) if draft.can_chain(k)]
    calls = [step(target, w) for w in windows] + [step(draft, w) for w in widths] + [chain(k) for k in chained]
    bar = _bar(progress, repeats, f"timing {len(calls)} calls")
    try:
        best = _interleaved_best(calls, repeats, lambda: None, lambda _round: bar.update(1), warm=True)
    finally:
        bar.close()
    target_s, draft_s = monotone(best[:len(windows)]), monotone(best[len(windows):len(windows) + len(widths)])
    return Latency(target_s, draft_s, dict(zip(chained, best[len(windows) + len(widths):])),
                   "eagle" if head else "model")


def _print_summary(plan: Any, out: Path, method: str) -> None:
    """A few lines: what was measured, what was chosen, what it should give, how to use it."""
    on, predicted, latency = plan.measured_on, plan.predicted, plan.latency
    tree, chain = predicted["tree"], predicted["chain"]
    shown = " ".join(f"{a:.3f}" for a in plan.acceptance[:8])
    tried = plan.counts.tried[0] if plan.counts is not None and plan.counts.tried else 0
    rows = plan.acceptance_by_depth[:SHOWN_DEPTHS]
    visits = plan.counts.tried_by_depth if plan.counts is not None else []
    deep = ", ".join(f"{row[0]:.3f}" + (f" ({visits[d][0]})" if d < len(visits) and visits[d] else "")
                     for d, row in enumerate(rows) if row)
    click.echo(f"probe: {on['images']} images, {on['rounds']} rounds, {tried} nodes tried; acceptance by "
               f"sibling rank (all depths) a = {shown}")
    if deep:
        prior = on.get("acceptance_prior_visits")
        shrunk = f"; each depth shrunk toward the pooled rate with {prior:g} pseudo-visits" if prior is not None else ""
        click.echo(f"rank 0 by depth, a_0(d) for d = 1..{len(rows)} (visits): {deep}{shrunk}")
    t1 = latency.target[0]
    marks = sorted({w for w in (2, 5, 9, 17, 26, 33, 65) if w <= len(latency.target)} | {len(latency.target)})
    click.echo(f"target step t(1) = {1000 * t1:.2f} ms; t(W)/t(1): "
               + ", ".join(f"W={w} {latency.target[w - 1] / t1:.2f}" for w in marks)
               + f"; draft pass (1 token) {1000 * latency.draft[0]:.2f} ms"
               + (f"; draft_chain calls for {', '.join(map(str, sorted(latency.chain)))} drafts" if latency.chain else ""))
    check, usual = on.get("chain_check", {}), predicted.get(f"chain_draft_len_{on.get('chain_check', {}).get('draft_len')}")
    if check and usual:
        click.echo(f"host work per round: tree {1000 * latency.host_round:.2f} ms + {1000 * latency.host_node:.3f} ms "
                   f"per node + {1000 * latency.host_level:.3f} ms per level, chain {1000 * latency.host_chain:.2f} ms, ar {1000 * latency.host_ar:.3f} ms per token; "
                   f"chain of {check['draft_len']}: {check['measured_tokens_per_round']:.2f} tokens/round measured, "
                   + (f"its chains priced at a_0 = {check['chain_a0_solved']:.3f} solved from it (sampled drafts, "
                      f"not the dynamic probe's point masses)" if "chain_a0_solved" in check
                      else f"{usual['tokens_per_round']:.2f} predicted"))
    dynamic = plan.dynamic
    what = f"dynamic tree (top-k {dynamic.tree_top_k})" if dynamic else "tree"
    click.echo(f"{what}: {tree['nodes']} nodes, depth {tree['depth']}: {tree['tokens_per_round']:.2f} tokens/round, "
               f"predicted {tree['speedup_vs_ar']:.2f}x ar; best chain (draft_len {chain['draft_len']}): "
               f"{chain['tokens_per_round']:.2f} tokens/round, {chain['speedup_vs_ar']:.2f}x ar; "
               f"tree / chain {predicted['speedup_vs_chain']:.2f}")
    use = dynamic.flags() if dynamic else f"--param tree=static --param static_tree={out}"
    if dynamic:
        click.echo(f"dynamic tree: --method {method} {use} (a positional estimate: the tree picks its nodes "
                   f"by draft confidence each round)")
    if predicted["faster"] == "tree":
        click.echo(f"faster here: the {what.split(' (')[0]}: --method {method} {use}")
    else:
        one_call = "" if chain["draft_len"] in latency.chain or chain["draft_len"] < 2 or latency.drafter != "model" else \
            f"; priced a draft step each: export --draft-chain {chain['draft_len']} drafts it in one call"
        click.echo(f"faster here: the chain (--param tree=chain --param draft_len={chain['draft_len']}{one_call}); "
                   f"the plan holds the best {'dynamic tree' if dynamic else 'tree'} all the same")
    click.echo(f"wrote {out}")
