"""How long the dashboard's plan takes to draw 10,000 jobs on 1,000 nodes, in headless Chromium.

Usage (a `quorum dev` cluster running, its URL and a token at hand):
    PY=$(scripts/pypi-venv.sh selenium 4.40.0 selenium)
    $PY benches/dashboard-render.py https://127.0.0.1:PORT TOKEN [RUNS]

The page is the real one, served by the replica; only its request for /api/v1/plan is answered
from a plan made here (1,000 nodes, 1,000 running jobs of 1-4 nodes, 9,000 pending ones
reserved on 1-4 nodes above them, as backfill would place them), so that the cluster need not
run 1,000 agents. Each run times the plan view from the request to the drawn chart (JSON parse,
building the SVG, and the browser's layout and paint of it), the median and the slowest of RUNS.
"""

import json
import random
import statistics
import sys

from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

url, token = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 10

random.seed(7)
now = 1_800_000_000_000
nodes = [{"name": f"n{i:04d}", "state": "MIXED", "reason": "", "cpus": 64, "alloc_cpus": 32, "gpus": 8} for i in range(1000)]
free_at = [now] * 1000
jobs = []
for i in range(10_000):
    width = random.choice([1, 1, 1, 2, 4])
    first = random.randrange(0, 1000 - width)
    span = list(range(first, first + width))
    running = i < 1000
    start = now - random.randrange(0, 3_600_000) if running else max(free_at[n] for n in span)
    limit = random.choice([600, 1800, 3600, 7200, 14400]) * 1000
    for n in span:
        free_at[n] = max(free_at[n], start + limit)
    jobs.append({
        "id": i + 1, "name": f"job{i}", "user": f"user{i % 50}", "partition": "gpu",
        "state": "RUNNING" if running else "PENDING", "reason": "" if running else "Resources",
        "priority_held": False, "nodes": [nodes[n]["name"] for n in span],
        "start_ms": start, "end_ms": start + limit,
    })
plan = json.dumps({"now_ms": now, "nodes": nodes, "jobs": jobs})

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000", "--ignore-certificate-errors"]:
    options.add_argument(flag)
driver = webdriver.Chrome(service=webdriver.ChromeService("/usr/bin/chromedriver"), options=options)
driver.set_script_timeout(120)
try:
    driver.get(url + "/#token=" + token)
    WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.body.dataset.rendered || ''"))
    # Leave the plan (its refresh would draw the real one) for a light page; answer
    # /api/v1/plan with the big plan.
    driver.execute_script("""
        location.hash = '#/cluster';
        window.__plan = arguments[0];
        const real = window.fetch;
        window.fetch = (input, init) => String(input).endsWith('/api/v1/plan')
            ? Promise.resolve(new Response(window.__plan, {status: 200, headers: {'Content-Type': 'application/json'}}))
            : real(input, init);
    """, plan)
    times = []
    for _ in range(runs):
        ms = driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const t0 = performance.now();
            planView().then(() => requestAnimationFrame(() => setTimeout(() => done(performance.now() - t0), 0)));
        """)
        times.append(ms)
    rects = driver.execute_script("return document.querySelectorAll('rect.job').length")
    print(json.dumps({"jobs": len(jobs), "nodes": len(nodes), "rects": rects, "median_ms": round(statistics.median(times), 1),
                      "max_ms": round(max(times), 1), "runs": [round(t, 1) for t in times]}))
finally:
    driver.quit()
