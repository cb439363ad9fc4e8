"""Draw the dashboard's panels from a short recorded run of a local fleet (docs/dashboards/pdfleet-dashboard.png).

    python docs/dashboards/render_panels.py record --seconds 90 --out /tmp/pdfleet-recording.json
    python docs/dashboards/render_panels.py render /tmp/pdfleet-recording.json --png docs/dashboards/pdfleet-dashboard.png

`record` starts `pdfleet local -f examples/tiny-cpu.yaml`, sends a mixed load through the
router (short and long prompts, streaming, a few malformed requests), and scrapes the router's
and every engine's /metrics every --every seconds. `render` evaluates each panel's PromQL,
exactly as the dashboard JSON has it, over those scrapes (pdfleet.operator.observability.evaluate)
and draws one chart per panel with matplotlib (the `docs` extra). Scrapes get the target labels
the chart's PodMonitor would add (namespace, fleet, pod, role, revision). The Fleet row's
operator metrics do not exist in a local fleet (no operator runs): those panels say so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CR = REPO / "examples" / "tiny-cpu.yaml"
DASHBOARD = HERE / "pdfleet.json"
NAMESPACE = "local"
REVISION = "local"
WORDS = ("prefill", "decode", "block", "cache", "router", "network", "engine", "token", "lease", "agent",
         "layer", "river", "winter", "stone", "light", "memory")


# --- record ----------------------------------------------------------------------------------


def start_fleet(workdir: Path) -> tuple[subprocess.Popen, str, dict]:
    state = workdir / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.operator.cli", "local", "-f", str(CR), "--state-file", str(state),
         "--run-dir", str(workdir / "run")],
        stdout=subprocess.PIPE, stderr=open(workdir / "runner.stderr", "wb"), text=True, start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("router: "):
            return proc, line.split(" ", 1)[1].strip(), json.loads(state.read_text())
    raise SystemExit(f"the fleet did not start; see {workdir / 'runner.stderr'}")


async def drive(router: str, model: str, until: float, concurrency: int) -> int:
    import aiohttp

    rng = random.Random(7)
    sent = 0

    async def worker() -> None:
        nonlocal sent
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            while time.monotonic() < until:
                sent += 1
                if sent % 15 == 0:  # a malformed request: counted as a client error by the router
                    async with session.post(router + "/v1/completions", data=b"{not json") as resp:
                        await resp.read()
                    continue
                prompt = " ".join(rng.choice(WORDS) for _ in range(rng.choice((8, 40, 120, 300, 600))))
                body = {"model": model, "prompt": prompt, "max_tokens": rng.choice((8, 16, 32, 48)),
                        "temperature": 0, "ignore_eos": True, "stream": rng.random() < 0.3}
                async with session.post(router + "/v1/completions", json=body) as resp:
                    await resp.read()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent


async def scrape_loop(targets: list[tuple[dict, str]], until: float, every: float, out: list) -> None:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < until:
            t = time.time()
            for labels, url in targets:
                async with session.get(url + "/metrics") as resp:
                    out.append({"t": t, "target": labels, "text": await resp.text()})
            await asyncio.sleep(every)


def record(args: argparse.Namespace) -> None:
    import yaml

    from pdfleet.operator.api import parse
    from pdfleet.operator.plan.engine import served_model_name

    doc = yaml.safe_load(CR.read_text())
    cr = parse(doc)
    fleet = doc["metadata"]["name"]
    with tempfile.TemporaryDirectory(prefix="pdfleet-render-") as tmp:
        proc, router, state = start_fleet(Path(tmp))
        try:
            common = {"namespace": NAMESPACE, "fleet": fleet}
            targets = [({**common, "pod": "router", "role": "router"}, router)]
            targets += [({**common, "pod": e["name"], "role": e["role"], "revision": REVISION}, e["url"])
                        for e in state["engines"]]
            scrapes: list = []

            async def run() -> int:
                start = time.monotonic()
                idle = start + args.idle
                end = idle + args.seconds
                scraper = asyncio.create_task(scrape_loop(targets, end + args.idle, args.every, scrapes))
                await asyncio.sleep(args.idle)  # a quiet start, then the load
                sent = await drive(router, served_model_name(cr.spec), end, args.concurrency)
                await scraper
                return sent

            sent = asyncio.run(run())
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(90)
    Path(args.out).write_text(json.dumps({"fleet": fleet, "requests_sent": sent, "scrapes": scrapes}))
    print(f"recorded {len(scrapes)} scrapes, {sent} requests sent -> {args.out}")


# --- render ----------------------------------------------------------------------------------


def legend(fmt: str, labels: dict) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def render(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdfleet.operator.observability.evaluate import Evaluator, Recording

    data = json.loads(Path(args.recording).read_text())
    recording = Recording()
    for scrape in data["scrapes"]:
        recording.add_scrape(scrape["t"], scrape["text"], scrape["target"])
    times = recording.times()
    t0 = times[0]
    evaluator = Evaluator(recording, {"namespace": ".*", "fleet": ".*"})
    dashboard = json.loads(DASHBOARD.read_text())

    rows: list[tuple[str, list[dict]]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            rows.append((panel["title"], []))
        else:
            rows[-1][1].append(panel)
    per_line = 3
    lines = sum(math.ceil(len(ps) / per_line) for _, ps in rows)
    fig = plt.figure(figsize=(18, 3.1 * lines + 0.6 * len(rows)))
    grid = fig.add_gridspec(lines + len(rows), per_line, height_ratios=sum(
        ([0.18] + [1] * math.ceil(len(ps) / per_line) for _, ps in rows), []),
        hspace=0.75, wspace=0.22, top=0.975, bottom=0.02)
    fig.suptitle(f"{dashboard['title']} — panels evaluated over a {times[-1] - t0:.0f} s recorded run of "
                 f"`pdfleet local` ({data['requests_sent']} requests sent; scrapes every "
                 f"{(times[-1] - t0) / max(len(times) - 1, 1):.1f} s; rate window {args.rate_interval})",
                 fontsize=13, y=0.995)
    line = 0
    for title, panels in rows:
        head = fig.add_subplot(grid[line, :])
        head.axis("off")
        head.text(0, 0.2, title, fontsize=15, fontweight="bold")
        line += 1
        for i, panel in enumerate(panels):
            ax = fig.add_subplot(grid[line + i // per_line, i % per_line])
            ax.set_title(panel["title"], fontsize=10, loc="left")
            drawn = 0
            for target in panel["targets"]:
                series: dict[tuple, list[tuple[float, float]]] = {}
                for t in times:
                    result = evaluator.query(target["expr"], t, args.rate_interval)
                    if isinstance(result, float):
                        result = {(): result}
                    for labels, value in result.items():
                        if math.isfinite(value):
                            series.setdefault(labels, []).append((t - t0, value))
                for labels, pts in sorted(series.items()):
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, label=legend(target["legendFormat"], dict(labels)), linewidth=1.4)
                    drawn += 1
            unit = panel["fieldConfig"]["defaults"].get("unit", "")
            if drawn:
                ax.legend(fontsize=7, loc="upper left", framealpha=0.6)
                ax.set_ylabel({"GBs": "GB/s", "reqps": "req/s", "ops": "/s", "percentunit": "fraction",
                               "s": "seconds"}.get(unit, ""), fontsize=8)
            else:
                operator_only = all("pdfleet_operator_" in tg["expr"] for tg in panel["targets"])
                ax.text(0.5, 0.5, "no data: the operator exports these\n(no operator runs in a local fleet)"
                        if operator_only else "no data in this run (no such event happened)",
                        ha="center", va="center", fontsize=9, color="gray", transform=ax.transAxes)
            ax.set_xlabel("seconds into the run", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        line += math.ceil(len(panels) / per_line)
    fig.savefig(args.png, dpi=args.dpi, bbox_inches="tight")
    print(f"wrote {args.png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--seconds", type=float, default=90)
    rec.add_argument("--idle", type=float, default=8, help="quiet seconds before and after the load")
    rec.add_argument("--every", type=float, default=2.0, help="scrape interval")
    rec.add_argument("--concurrency", type=int, default=3)
    rec.add_argument("--out", required=True)
    ren = sub.add_parser("render")
    ren.add_argument("recording")
    ren.add_argument("--png", default=str(HERE / "pdfleet-dashboard.png"))
    ren.add_argument("--rate-interval", default="10s")
    ren.add_argument("--dpi", type=int, default=70)
    args = parser.parse_args()
    record(args) if args.command == "record" else render(args)


if __name__ == "__main__":
    main()
