"""Drives the dashboard in headless Chromium (through chromedriver, by Selenium) as a user
would, for cli/tests/dashboard.rs. Arguments: one JSON object with the replica's URL, the
user's token, the running job's and the reserved job's ids, where the leader expects the
reserved one to start, and where to keep the plan's screenshot. Prints what it saw as JSON;
fails (exit 1, with the reason) when the page is not as it should be."""

import json
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

args = json.loads(sys.argv[1])
options = webdriver.ChromeOptions()
options.binary_location = args.get("chromium", "/usr/bin/chromium")
for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
             # The replica's certificate is from the cluster's own CA, which this fresh profile
             # does not trust; the connection is TLS all the same.
             "--ignore-certificate-errors"]:
    options.add_argument(flag)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service(args.get("chromedriver", "/usr/bin/chromedriver")), options=options)
wait = WebDriverWait(driver, 20)
seen = {}


def find(css):
    return wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def go(route):
    """Shows `route` and waits until the page has drawn it (it marks each render with its time
    and route)."""
    before = driver.execute_script("return document.body.dataset.rendered || ''")
    driver.execute_script("location.hash = arguments[0]", route)
    wait.until(lambda d: d.execute_script("return [document.body.dataset.rendered || '', document.body.dataset.route]") [1] == route
               and d.execute_script("return document.body.dataset.rendered || ''") != before)


try:
    running, reserved = args["running"], args["reserved"]
    driver.get(args["url"] + "/#token=" + args["token"])
    wait.until(lambda d: d.execute_script("return document.body.dataset.user || ''") == args["user"])
    seen["address_after_sign_in"] = driver.current_url
    assert "token" not in driver.current_url, "the token stays in the address bar"

    # The queue: both jobs, the reserved one with its expected start.
    go("#/queue")
    find(f'#queue tr[data-job="{running}"]')
    row = find(f'#queue tr[data-job="{reserved}"]')
    seen["queue_row"] = row.text
    # In Slurm's order: the pending job before the running one (same partition).
    order = [r.get_attribute("data-job") for r in driver.find_elements(By.CSS_SELECTOR, "#queue tr[data-job]")]
    assert order.index(str(reserved)) < order.index(str(running)), f"the queue's order: {order}"

    # The plan: the running job from now to its limit on both nodes, the reserved one above it
    # from where the leader expects it to start.
    go("#/plan")
    rect = find(f'rect[data-job="{reserved}"]')
    geometry = driver.execute_script(
        """const svg = document.getElementById('plan'), r = arguments[0];
        return {now: +svg.dataset.now, top: +svg.dataset.top, height: +svg.dataset.height, last: +svg.dataset.last,
                y: +r.getAttribute('y'), h: +r.getAttribute('height'), start: +r.dataset.start, end: +r.dataset.end,
                running: [...document.querySelectorAll('rect[data-job="' + arguments[1] + '"]')].map(x => x.dataset.node)};""",
        rect, running)
    seen["plan"] = geometry
    assert geometry["start"] == args["expected_start_ms"], f"the reserved job's rectangle starts at {geometry['start']}, queue --start says {args['expected_start_ms']}"
    bottom_at = geometry["top"] + geometry["height"] - (geometry["start"] - geometry["now"]) * geometry["height"] / (geometry["last"] - geometry["now"])
    assert abs(geometry["y"] + geometry["h"] - bottom_at) < 1.5, f"the rectangle's bottom is at {geometry['y'] + geometry['h']}, its start at {bottom_at}"
    assert len(geometry["running"]) == 2, f"the running job is drawn on {geometry['running']}"
    # The maintenance reservation, on its node over its window.
    resv = find('rect.resv.maint[data-resv="maint"]')
    held = driver.execute_script("const r = arguments[0]; return {node: r.dataset.node, start: +r.dataset.start, end: +r.dataset.end};", resv)
    seen["reservation"] = held
    assert held == {"node": "node01", "start": args["maint_start_ms"], "end": args["maint_end_ms"]}, f"the reservation is drawn as {held}"
    driver.save_screenshot(args["screenshot"])

    # Its details, from a click; cancelled from the page.
    rect.click()
    find(f'#panel #job[data-job="{reserved}"]')
    button = find("#cancel-job")
    button.click()
    wait.until(lambda d: "Really" in d.find_element(By.ID, "cancel-job").text)
    d = driver.find_element(By.ID, "cancel-job")
    d.click()
    wait.until(lambda d: d.find_element(By.ID, "cancel-job").text == "Cancelled")

    # The job's own page; the nodes; the replicas.
    go(f"#/job/{running}")
    seen["job_state"] = find("#job-state").text
    wait.until(lambda d: "hello from the dashboard" in d.find_element(By.ID, "job-log").text)
    go("#/nodes")
    seen["nodes"] = len(driver.find_elements(By.CSS_SELECTOR, "#nodes tr")) - 1
    go("#/cluster")
    seen["replicas"] = len(driver.find_elements(By.CSS_SELECTOR, "#replicas tr")) - 1
    seen["leaders"] = len(driver.find_elements(By.CSS_SELECTOR, "#replicas tr.leader"))

    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"console errors: {errors}"
    print(json.dumps(seen))
except Exception as e:  # the reason, with what was seen so far and the page as it is
    print(json.dumps(seen), file=sys.stderr)
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    print(driver.page_source[:4000], file=sys.stderr)
    print(driver.get_log("browser"), file=sys.stderr)
    sys.exit(1)
finally:
    driver.quit()
