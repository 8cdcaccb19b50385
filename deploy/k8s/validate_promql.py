"""PromQL of the monitoring overlay: the metrics and labels the servers
export, read from their Rust sources (exported_metrics); the alerts'
expressions and the Grafana dashboard's queries name only those
(check_rules, check_dashboard), docs/operations.md shows each alert; with
promtool installed, every expression parses and the alerts pass
alerts.test.yaml (check_promql_with_promtool).
"""

import copy
import json
import pathlib
import re
import shutil
import subprocess

import yaml

from validate_common import REPO, reporter


# Monitoring (overlays/monitoring). The metrics the servers export are read
# from their source: a metric or label renamed there fails here.
METRIC_SOURCES = ("agent/src/process/metrics.rs", "agent/rendezvous/src/metrics.rs", "agent/ops/src/exposition.rs")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus gives every series it scrapes through a PodMonitor or a
# ServiceMonitor, and the metrics of its own the dashboard and alerts may use.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}
PROMETHEUS_METRICS = {"up"}
# Grafana's own variables, and what stands for them when promtool parses.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Overlays that must scrape both servers and carry the alerts and a dashboard.
MONITORED = {"monitoring"}
ALERTS_TESTS = "alerts.test.yaml"
# Every alert is explained there.
ALERTS_DOC = "docs/operations.md"
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


def exported_metrics():
    """(metric names, label names) the agents and the rendezvous export: the
    `"kindling_…"` literals of METRIC_SOURCES (outside their tests), each
    histogram's series, and the keys of the samples' labels."""
    names, labels = set(), set()
    for rel in METRIC_SOURCES:
        text = (REPO / rel).read_text().split("#[cfg(test)]")[0]
        names |= set(re.findall(r'"(kindling_[a-z_]+)"', text))
        # family(&mut e, "name", "help", MetricType::Kind) (and single(…)):
        # prometheus-client adds `_total` to a counter's samples and the
        # bucket, sum and count series (with their `le`) to a histogram's.
        for name, kind in re.findall(
            r'(?:family|single)\(\s*(?:&mut )?\w+,\s*"(kindling_[a-z_]+)",\s*"(?:[^"\\]|\\.)*",\s*MetricType::(\w+)', text
        ):
            if kind == "Counter":
                names.add(name + "_total")
            elif kind == "Histogram":
                names |= {name + s for s in HISTOGRAM_SUFFIXES}
                labels.add("le")
        # ("job_id", &job), ("agent", a), ("le", le.as_str()): a key, then a variable.
        labels |= set(re.findall(r'\(\s*"([a-z_]+)"\s*,\s*(?:[&*][\w.]+|\w+|\w+\.as_str\(\))\s*\)', text))
    labels = {name for name in labels if not name.startswith("kindling_")}
    if not names or not labels:
        raise SystemExit(f"no metrics found in {', '.join(METRIC_SOURCES)}: did the exposition move?")
    return names, labels


def promql_names(expr):
    """The metric names, the label names and the `by (…)` labels of a PromQL
    expression (string literals left out)."""
    bare = STRING.sub('""', expr)
    metrics = set(re.findall(r"(?<![\w:])kindling_[\w:]*", bare))
    metrics |= set(re.findall(r"(?<![\w:])([A-Za-z_:][\w:]*)\s*\{", bare))
    labels = set()
    for body in re.findall(r"\{([^}]*)\}", bare):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", body))
    by = set()
    for op, body in re.findall(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", bare):
        names = {n.strip() for n in body.split(",") if n.strip()}
        labels |= names
        if op == "by":
            by |= names
    return metrics, labels, by


def template_labels(text):
    """Labels a Grafana legend (`{{job_id}}`) or an alert annotation
    (`{{ $labels.job_id }}`) prints."""
    return set(re.findall(r"\{\{\s*(?:\$labels\.)?([A-Za-z_]\w*)\s*\}\}", text or ""))


def check_promql(expr, where, exported, errors, printed="", jobs=None):
    """Only exported metrics and labels; what `printed` (a legend, the
    annotations) prints is a label the result can have; `job` matchers name
    the jobs the monitors give their series (`jobs`, where known)."""
    bad = reporter(errors, where)
    metrics, labels = exported
    for op, value in re.findall(r'(?<![\w])job\s*(=~|=)\s*"([^"]*)"', expr):
        for job in (value.split("|") if op == "=~" else [value]):
            if jobs is not None and job not in jobs:
                bad(f"job {job!r} is not a job the monitors scrape ({sorted(jobs)})")
    used, used_labels, by = promql_names(expr)
    for m in sorted(used - metrics - PROMETHEUS_METRICS):
        bad(f"{m} is not a metric the agents or the rendezvous export "
            f"({', '.join(METRIC_SOURCES)}) nor one of Prometheus' {sorted(PROMETHEUS_METRICS)}")
    for name in sorted(used_labels - labels - TARGET_LABELS):
        bad(f"label {name!r} is on no series the agents or the rendezvous export")
    shown = template_labels(printed)
    for name in sorted(shown - labels - TARGET_LABELS):
        bad(f"prints label {name!r}, which no exported series has")
    if by and shown - by:
        bad(f"prints {sorted(shown - by)}, which `by ({', '.join(sorted(by))})` drops")


def grafana_to_promql(expr):
    """The expression as Prometheus gets it: Grafana's variables replaced."""
    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return GRAFANA_VARIABLES.get(name, ".*")
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


def check_dashboard(text, where, exported, errors, jobs=None):
    """A Grafana dashboard: parses; a `datasource` variable every query goes
    through; panels with unique ids and gridPos that do not overlap; every
    query names exported metrics and labels and defined variables. Returns
    (record name, PromQL) of every query, for promtool."""
    bad = reporter(errors, where)
    try:
        dash = json.loads(text)
    except json.JSONDecodeError as e:
        bad(f"not JSON: {e}")
        return []
    for key in ("uid", "title", "schemaVersion", "templating", "panels"):
        if key not in dash:
            bad(f"no {key}")
    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list", [])}
    ds = variables.get("datasource") or {}
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        bad("needs a variable `datasource` of type datasource, query prometheus")

    def through_variable(obj, at):
        if obj.get("datasource") is not None and obj["datasource"] != DATASOURCE:
            bad(f"{at}: datasource {obj['datasource']} is not {DATASOURCE}")

    def variables_of(expr, at):
        for m in re.finditer(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", expr):
            name = m.group(1) or m.group(2) or m.group(3)
            if name not in variables and name not in GRAFANA_VARIABLES:
                bad(f"{at}: variable ${name} is not defined")

    queries = []
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        through_variable(v, f"variable {name}")
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*", q or "")
        if not m:
            bad(f"variable {name}: {q!r} is not label_values(series, label)")
            continue
        series, label = m.groups()
        at = f"{where}: variable {name}"
        check_promql(series or "", at, exported, errors, printed=f"{{{{{label}}}}}")
        variables_of(series or "", at)
        if series:
            queries.append((f"dashboard:variable_{name}", grafana_to_promql(series)))

    panels = list(dash.get("panels") or [])
    for p in list(panels):
        panels += p.get("panels") or []  # inside collapsed rows
    ids, placed = set(), []
    for p in panels:
        at = f"panel {p.get('id')} {p.get('title')!r}"
        if not isinstance(p.get("id"), int) or p["id"] in ids:
            bad(f"{at}: id missing or repeated")
        ids.add(p.get("id"))
        gp = p.get("gridPos") or {}
        if not all(isinstance(gp.get(k), int) for k in "hwxy") or gp["w"] < 1 or gp["h"] < 1 \
                or gp["x"] < 0 or gp["x"] + gp["w"] > 24:
            bad(f"{at}: gridPos {gp} is not h, w, x, y within 24 columns")
        elif p in (dash.get("panels") or []):
            for other, ogp in placed:
                if gp["x"] < ogp["x"] + ogp["w"] and ogp["x"] < gp["x"] + gp["w"] \
                        and gp["y"] < ogp["y"] + ogp["h"] and ogp["y"] < gp["y"] + gp["h"]:
                    bad(f"{at}: overlaps {other}")
            placed.append((at, gp))
        if p.get("type") == "row":
            continue
        through_variable(p, at)
        targets = p.get("targets") or []
        if not targets:
            bad(f"{at}: no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            bad(f"{at}: refIds {refs} missing or repeated")
        for t in targets:
            tat = f"{at} target {t.get('refId')}"
            through_variable(t, tat)
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                bad(f"{tat}: no expr")
                continue
            check_promql(expr, f"{where}: {tat}", exported, errors, printed=t.get("legendFormat", ""), jobs=jobs)
            variables_of(expr, tat)
            queries.append((f"dashboard:panel_{p.get('id')}_{t.get('refId')}", grafana_to_promql(expr)))
    return queries


def documented_expressions(doc):
    """Alert name -> expression (whitespace collapsed) in the doc's ```promql
    blocks, where each expression follows a comment line `# AlertName …`."""
    shown = {}
    for block in re.findall(r"```promql\n(.*?)```", doc, re.S):
        name = None
        for line in block.splitlines():
            m = re.match(r"#\s*(\w+)", line)
            if m and line.startswith("# ") and m.group(1)[0].isupper():
                name = m.group(1)
                shown[name] = ""
            elif name and not line.startswith("#"):
                shown[name] = " ".join((shown[name] + " " + line).split())
    return shown


def check_rules(rule, where, exported, errors, jobs=None):
    """A PrometheusRule's expressions and annotations name exported metrics
    and labels, and ALERTS_DOC names each alert and shows its expression
    (whitespace aside)."""
    doc = (REPO / ALERTS_DOC).read_text()
    shown = documented_expressions(doc)
    for g in rule["spec"].get("groups") or []:
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record")
            at = f"{where}: {rule['kind']}/{rule['metadata']['name']}: {name}"
            bad = reporter(errors, at)
            printed = " ".join((r.get("annotations") or {}).values())
            expr = str(r.get("expr", ""))
            check_promql(expr, at, exported, errors, printed=printed, jobs=jobs)
            if r.get("alert") and f"`{r['alert']}`" not in doc:
                bad(f"{ALERTS_DOC} does not explain it")
            elif r.get("alert") and shown.get(r["alert"]) != " ".join(expr.split()):
                bad(f"{ALERTS_DOC}'s promql block shows another expression for it: "
                    f"{shown.get(r['alert'])!r}")


def check_promql_with_promtool(root, overlay, rules, queries, tmp, errors):
    """promtool parses every alert and dashboard query and runs the
    overlay's ALERTS_TESTS against its PrometheusRules. Returns what it did,
    for the summary; None without promtool."""
    bad = reporter(errors, f"overlays/{overlay}")
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    work = pathlib.Path(tmp) / f"promtool-{overlay}"
    work.mkdir()
    groups = [g for r in rules for g in r["spec"]["groups"]]
    rule_file = work / "rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": groups}))
    # The rule file the tests name (rule_files): the alerts with their
    # summary as their only annotation, so the tests need not repeat the
    # descriptions.
    summaries = copy.deepcopy(groups)
    for g in summaries:
        for r in g.get("rules") or []:
            if "annotations" in r:
                r["annotations"] = {k: v for k, v in r["annotations"].items() if k == "summary"}
    (work / "kindling-rules.yaml").write_text(yaml.safe_dump({"groups": summaries}))
    query_file = work / "dashboard-queries.yaml"
    query_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": name, "expr": expr} for name, expr in queries]}]}))
    done = []
    run = lambda *args: subprocess.run([promtool, *args], capture_output=True, text=True)  # noqa: E731
    checked = run("check", "rules", str(rule_file), str(query_file))
    if checked.returncode != 0:
        bad(f"promtool check rules:\n{checked.stdout}{checked.stderr}")
    else:
        done.append(f"{len(queries)} dashboard queries and the alerts parsed")
    tests = root / "overlays" / overlay / ALERTS_TESTS
    if tests.exists():
        shutil.copy(tests, work / ALERTS_TESTS)
        tested = run("test", "rules", str(work / ALERTS_TESTS))
        if tested.returncode != 0:
            bad(f"promtool test rules {ALERTS_TESTS}:\n{tested.stdout}{tested.stderr}")
        else:
            done.append(f"{ALERTS_TESTS} passed")
    elif overlay in MONITORED:
        bad(f"no {ALERTS_TESTS}")
    return "; ".join(done)
