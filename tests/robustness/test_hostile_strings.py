"""XSS and terminal-escape payloads in every user-controlled field.

Run and experiment names, param keys and values, tag keys and values, MLflow users,
dataset names and sources, Slurm job names, users and accounts, telemetry host names and
checkpoint paths all carry payloads. The weekly report is opened in headless Debian
Chromium: no script runs (no dialog, no beacon variable), no request leaves the file, no
console error. Terminal output carries no escape or control characters from the data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, log_train_dataset

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts"
PINNED = {"AUDIT_NOW": "2026-11-30T08:00:00"}
T0_MS = 1_794_787_200_000  # 2026-11-16T00:00:00Z

# Markdown for chat and e-mail: an image loads when the message is shown
MARKDOWN_PAYLOADS = [
    "![pixel](http:\\\\127.0.0.1:9\\pixel.png)",
    "[click here](http:\\\\127.0.0.1:9\\phish)",
    "[ref]: http:\\\\127.0.0.1:9\\ref",
    "<http:\\\\127.0.0.1:9\\autolink>",
    "**bold** `code` ~~gone~~ _em_",
]
# Payloads safe to use in a file name and a sacct field (no '/', no '|', no newline).
PAYLOADS = [
    "<script>window.__pwned=1;alert(1)</script>",
    "<img src=x onerror=window.__pwned=2>",
    '"><svg onload=window.__pwned=3>',
    "'><body onload=window.__pwned=4>",
    "javascript:window.__pwned=5",
    "<iframe srcdoc='<script>parent.__pwned=6</script>'>",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__pwned=7>",
    "<img src=http:\\\\127.0.0.1:9\\beacon.png>",
    "<link rel=stylesheet href=http:\\\\127.0.0.1:9\\x.css>",
    "<meta http-equiv=refresh content='0;url=http:\\\\127.0.0.1:9'>",
    "<base href=http:\\\\127.0.0.1:9>",
    "<a href=javascript:window.__pwned=8>click</a>",
    "<div style=background:url(http:\\\\127.0.0.1:9\\bg)>",
    "</script><script>window.__pwned=9</script>",
    "<!--<script>window.__pwned=10</script>-->",
    "{{constructor.constructor('window.__pwned=11')()}}",
    "${window.__pwned=12}",
    "<svg><animate onbegin=window.__pwned=13 attributeName=x dur=1s>",
    "<details open ontoggle=window.__pwned=14>",
    "<object data=javascript:window.__pwned=15>",
    "\u202egnp.exe",  # right-to-left override
    "\x1b[31mred\x1b[0m",
    "\x1b]8;;http:\\\\evil\x07link\x1b]8;;\x07",  # OSC 8 hyperlink
    "\x9b31mC1-CSI",
    "bell\x07and\x08backspace",
    r"$\frac{$ broken mathtext",  # matplotlib would parse $...$ in chart labels as TeX
    r"$\undefinedmacro{x}$",
    *MARKDOWN_PAYLOADS,
]


def _sacct_field(text: str) -> str:
    return text.replace("|", "!").replace("\n", " ")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    from click.testing import CliRunner
    from mlflow import MlflowClient
    from mlflow.entities import Param

    from audit.cli import cli

    root = tmp_path_factory.mktemp("hostile")
    store = root / "mlruns"
    scratch = root / "scratch"
    client = MlflowClient(tracking_uri=store.as_uri())
    sacct = [
        "JobID|JobName|User|Account|Partition|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
        "NNodes|NCPUS|NodeList|AllocTRES|ReqTRES|TRESUsageInMax"
    ]
    telemetry = root / "gpu"
    telemetry.mkdir()
    for i, payload in enumerate(PAYLOADS):
        experiment = client.create_experiment(f"experiment {i}")
        # the file store's own name lookup chokes on quotes: rename in meta.yaml directly
        meta_path = store / experiment / "meta.yaml"
        meta = yaml.safe_load(meta_path.read_text())
        meta["name"] = f"{payload} #{i}"
        meta_path.write_text(yaml.safe_dump(meta))
        # a node list's own syntax ('[', ']', ',') cannot be part of a host name, nor glob
        # characters of the telemetry file named after it (polars reads '*' as a glob)
        host = re.sub(r"[/\x00\[\],*?]", "_", f"h{i}-{payload}")
        job_id = str(8_000_000 + i)
        start = T0_MS + i * 3 * 3_600_000
        folder = scratch / f"{i}-{payload}"
        for copy in range(2):  # identical twins: DUP001 quotes names and params in a finding
            run = client.create_run(
                experiment,
                start_time=start + copy * 150 * 60_000,
                run_name=payload,
                tags={
                    "team": payload,
                    "mlflow.user": payload,
                    "slurm_job_id": job_id,
                },
            )
            client.log_batch(
                run.info.run_id,
                params=[
                    Param("learning_rate", "1e-5"),
                    Param("method", "sft"),
                    Param("num_gpus", "8"),
                    Param("note", payload),
                    Param("output_dir", str(folder)),
                ],
            )
            log_train_dataset(client, run.info.run_id, payload, f"d{i}", payload)
            client.set_terminated(
                run.info.run_id, "FINISHED", end_time=start + copy * 150 * 60_000 + 2 * 3_600_000
            )
            # MLflow's client refuses such keys; other writers of a file store do not
            run_dir = store / experiment / run.info.run_id
            key = f"k{i}-{payload}".replace("/", "_").replace("\x00", "")
            (run_dir / "params" / key).write_text(payload)
            (run_dir / "tags" / key).write_text(payload)
        begin, end = (
            f"2026-11-{16 + i * 3 // 24:02d}T{i * 3 % 24:02d}:00:00",
            f"2026-11-{16 + (i * 3 + 2) // 24:02d}T{(i * 3 + 2) % 24:02d}:00:00",
        )
        tres = "billing=96,cpu=96,gres/gpu=8,mem=768G,node=1"
        fields = [job_id, payload, payload, payload, "gpu", "COMPLETED", begin, begin, end]
        sacct.append(
            "|".join(
                [_sacct_field(f) for f in fields] + ["7200", "600", "1", "96", host, tres, tres, ""]
            )
        )
        # one GPU busy, seven idle: OVP rules name the job, its user and its host
        lines = ["timestamp, index, utilization.gpu [%], memory.used [MiB]"]
        for minute in range(0, 120, 2):
            stamp = f"2026/11/{16 + (i * 3 + minute // 60) // 24:02d} {(i * 3 + minute // 60) % 24:02d}:{minute % 60:02d}:00.000"
            lines += [
                f"{stamp}, {g}, {95 if g == 0 else 0} %, {60000 if g == 0 else 3} MiB"
                for g in range(8)
            ]
        (telemetry / f"{host}.csv").write_text("\n".join(lines) + "\n")
        for step in (500, 1000, 1500):
            checkpoint = folder / f"checkpoint-{step}"
            checkpoint.mkdir(parents=True)
            with open(checkpoint / "model.safetensors", "wb") as fh:
                fh.truncate(15_000_000_000)
            (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (root / "week.sacct").write_text("\n".join(sacct) + "\n")
    db = root / "w.duckdb"
    runner = CliRunner()
    for args in (
        ["ingest", "mlflow", "--tracking-uri", str(store)],
        ["ingest", "slurm", str(root / "week.sacct")],
        ["ingest", "gpu", *map(str, sorted(telemetry.glob("*.csv")))],
        ["ingest", "checkpoints", str(scratch)],
    ):
        result = runner.invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
    return {"db": db, "root": root}


def cli_output(db: Path, *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from audit.cli import cli

    result = CliRunner().invoke(cli, ["--db", str(db), *args], env=PINNED, catch_exceptions=False)
    return result.exit_code, result.stdout + result.stderr


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@pytest.mark.parametrize(
    "args",
    [
        ("scan",),
        ("scan", "--format", "md"),
        ("runs", "search", "params.method = 'sft'"),
        ("status",),
        ("report", "weekly", "--week", "2026-W47", "--format", "md"),
    ],
)
def test_terminal_output_has_no_control_characters(hostile, args):
    code, out = cli_output(hostile["db"], *args)
    assert code in (0, 1), out
    assert CONTROL.findall(out) == [], f"control characters reached the terminal: {args}"
    assert "\u202e" not in out  # bidi overrides are shown escaped too


def test_csv_keeps_values_exact_in_a_pipe_and_escapes_them_on_a_terminal(hostile):
    import os
    import pty
    import subprocess
    import sys

    args = [sys.executable, "-m", "audit", "--db", str(hostile["db"]), "runs", "search"]
    args += ["params.method = 'sft'", "--format", "csv"]
    piped = subprocess.run(args, capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "\x1b[31mred\x1b[0m" in piped  # data, exactly
    leader, follower = pty.openpty()
    process = subprocess.Popen(args, stdout=follower, stderr=follower, cwd=REPO)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    process.wait()
    os.close(leader)
    text = shown.decode("utf-8", "replace")
    assert process.returncode == 0, text
    assert "\\x1b[31mred" in text
    assert CONTROL.findall(text.replace("\r\n", "\n")) == []


def test_findings_carry_the_payloads(hostile):
    """The payloads really reach the report (else the browser test proves nothing)."""
    code, out = cli_output(
        hostile["db"], "report", "weekly", "--week", "2026-W47", "--format", "json"
    )
    assert code == 0
    report = json.loads(out)
    text = json.dumps(report)
    rules = {f["rule"] for f in report["findings"]}
    assert {"DUP001", "OVP001"} <= rules, rules
    assert "<script>window.__pwned=1;alert(1)</script>" in text


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian chromium not installed (apt-get install chromium)"
)
def test_no_script_runs_and_no_request_leaves_the_page(hostile, tmp_path):
    from playwright.sync_api import sync_playwright

    target = tmp_path / "hostile.html"
    code, out = cli_output(
        hostile["db"], "report", "weekly", "--week", "2026-W47", "--output", str(target)
    )
    assert code == 0, out
    html = target.read_text()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page()
            requests, dialogs, errors = [], [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(target.as_uri())
            page.wait_for_load_state("load")
            # open every details element and click every link-free control, as a reader would
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            page.wait_for_timeout(300)
            pwned = page.evaluate("window.__pwned")
            body = page.inner_text("body")
            page.close()
        finally:
            browser.close()
    assert pwned is None
    assert dialogs == []
    assert requests == [target.as_uri()]
    assert errors == []
    assert "<script>window.__pwned=1;alert(1)</script>" in body  # shown as text
    assert "<script>window.__pwned" not in html  # and escaped in the file
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "hostile-payloads.txt").write_text(
        f"payloads: {len(PAYLOADS)}; script executions: 0; requests beyond the file: 0\n"
    )


@pytest.fixture(scope="module")
def markdown_names(tmp_path_factory) -> Path:
    """Twin runs named by the Markdown payloads only: every finding names one of them."""
    from click.testing import CliRunner
    from mlflow import MlflowClient
    from mlflow.entities import Param

    from audit.cli import cli

    root = tmp_path_factory.mktemp("markdown")
    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    experiment = client.create_experiment("markdown")
    for i, payload in enumerate(MARKDOWN_PAYLOADS):
        for copy in range(2):
            start = T0_MS + i * 6 * 3_600_000 + copy * 3 * 3_600_000
            run = client.create_run(experiment, start_time=start, run_name=payload)
            client.log_batch(
                run.info.run_id,
                params=[Param("learning_rate", f"{i}e-5"), Param("num_gpus", "8")],
            )
            client.set_terminated(run.info.run_id, "FINISHED", end_time=start + 2 * 3_600_000)
    db = root / "w.duckdb"
    args = ["--db", str(db), "ingest", "mlflow", "--tracking-uri", str(root / "mlruns")]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return db


@pytest.mark.parametrize(
    "args",
    [("scan", "--format", "md"), ("report", "weekly", "--week", "2026-W47", "--format", "md")],
    ids=" ".join,
)
def test_markdown_output_has_no_markup_from_the_data(markdown_names, args):
    """Parsed by a CommonMark parser (with tables), as a chat or mail client would: no
    image, no link, no raw HTML, no code span comes from a run name or message."""
    from markdown_it import MarkdownIt

    code, out = cli_output(markdown_names, *args)
    assert code in (0, 1), out
    for word in ("pixel", "click here", "ref", "autolink", "bold"):  # shown, as text
        assert word in out, word
    tokens = MarkdownIt("commonmark").enable("table").parse(out)
    found = []
    for token in tokens:
        for child in [token, *(token.children or [])]:
            if child.type in ("image", "link_open", "html_inline", "html_block", "code_inline"):
                found.append((child.type, child.content or child.attrs))
    assert found == []
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) >= 1 + len(MARKDOWN_PAYLOADS), "every duplicate is a row of the table"
