//! Pictures of a replay, as self-contained SVG: the schedule as nodes × time with every job a
//! rectangle, and the queue length and utilization over time.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{JobRecord, SimResult};

const LEFT: f64 = 70.0;
const TOP: f64 = 30.0;
const PLOT_W: f64 = 1100.0;

/// `+1-06:00` style label for a time since the trace's start.
fn time_label(s: u64) -> String {
    let (d, h, m) = (s / 86_400, s / 3600 % 24, s / 60 % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}")
    }
}

/// A tick step that gives at most about a dozen ticks over `span` seconds.
fn tick_step(span: u64) -> u64 {
    const STEPS: [u64; 14] =
        [60, 300, 600, 1800, 3600, 7200, 21_600, 43_200, 86_400, 172_800, 604_800, 1_209_600, 2_592_000, 7_776_000];
    STEPS.iter().copied().find(|s| span / s <= 12).unwrap_or(31_536_000)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A job's colour: spread around the hue circle by its id, the same on every run.
fn colour(id: u64) -> String {
    format!("hsl({},65%,62%)", (id * 137) % 360)
}

fn time_axis(out: &mut String, from: u64, to: u64, x: impl Fn(u64) -> f64, y0: f64, y1: f64) {
    let step = tick_step(to - from);
    let mut t = from.div_ceil(step) * step;
    while t <= to {
        let px = x(t);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{y0:.1}" x2="{px:.1}" y2="{y1:.1}" stroke="#ccc" stroke-width="0.5"/><text x="{px:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
            y1 + 12.0,
            time_label(t)
        );
        out.push('\n');
        t += step;
    }
}

/// Assigns each job on each node the CPU lanes it occupies, so that jobs sharing a node are
/// drawn side by side: greedily by start time, the lowest lanes free at the job's start.
fn lanes(jobs: &[&JobRecord], nodes: usize, cpus: u32) -> BTreeMap<(u64, u32), Vec<u32>> {
    let mut free_at: Vec<Vec<u64>> = vec![vec![0; cpus as usize]; nodes];
    let mut order: Vec<&&JobRecord> = jobs.iter().collect();
    order.sort_by_key(|j| (j.start_s, j.id));
    let mut out = BTreeMap::new();
    for j in order {
        let (Some(start), Some(end)) = (j.start_s, j.end_s) else { continue };
        for &(node, n) in &j.alloc {
            let lanes = &mut free_at[node as usize];
            let mut chosen: Vec<u32> = (0..cpus).filter(|&l| lanes[l as usize] <= start).take(n as usize).collect();
            if chosen.len() < n as usize {
                // Only a job let run past its limit can find its node full; draw it on top.
                chosen = (0..n.min(cpus)).collect();
            }
            for &l in &chosen {
                lanes[l as usize] = end;
            }
            out.insert((j.id, node), chosen);
        }
    }
    out
}

/// The schedule between `from` and `to` (seconds since the trace's start) as nodes × time.
pub fn gantt(result: &SimResult, from: u64, to: u64) -> String {
    let to = to.max(from + 1);
    let cpus = result.machine.cpus_per_node.max(1);
    let nodes = result.node_names.len().max(1);
    let rows = nodes as f64 * f64::from(cpus);
    let lane_h = (900.0 / rows).clamp(0.25, 14.0);
    let height = rows * lane_h;
    let x = |t: u64| LEFT + (t.clamp(from, to) - from) as f64 / (to - from) as f64 * PLOT_W;
    let visible: Vec<&JobRecord> = result
        .jobs
        .iter()
        .filter(|j| matches!((j.start_s, j.end_s), (Some(s), Some(e)) if s < to && e.max(s + 1) > from))
        .collect();
    let lanes = lanes(&visible, nodes, cpus);
    let mut out = String::new();
    let (w, h) = (LEFT + PLOT_W + 20.0, TOP + height + 40.0);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="18" font-size="13">{} jobs — {} nodes × {} CPUs, policy {}, {} to {} (d-hh:mm since the trace's start)</text>"#,
        result.jobs.len(),
        nodes,
        cpus,
        escape(&result.policy_name),
        time_label(from),
        time_label(to)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{height:.2}" fill="#f7f7f7" stroke="#888" stroke-width="0.5"/>"##
    );
    time_axis(&mut out, from, to, x, TOP, TOP + height);
    // Node labels, thinned to about 40.
    let every = nodes.div_ceil(40).max(1);
    for (i, name) in result.node_names.iter().enumerate().step_by(every) {
        let y = TOP + (i as f64 + 0.5) * f64::from(cpus) * lane_h;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            LEFT - 4.0,
            y,
            escape(name)
        );
    }
    for j in &visible {
        let (start, end) = (j.start_s.unwrap_or(0), j.end_s.unwrap_or(0));
        let (x0, x1) = (x(start), x(end.max(start + 1)));
        let title = format!(
            "job {} (trace #{}), user {}, {} CPUs, submit {}, start {}, end {}{}",
            j.id,
            j.number,
            escape(&j.user),
            j.procs,
            time_label(j.submit_s),
            time_label(start),
            time_label(end),
            if j.killed { ", killed at its limit" } else { "" }
        );
        // One rectangle per run of consecutive lanes; runs on consecutive nodes with the same
        // lanes merge, so that a whole-node job over a range of nodes is one rectangle.
        let mut rects: Vec<(f64, f64)> = Vec::new();
        let mut nodes_sorted: Vec<u32> = j.alloc.iter().map(|(n, _)| *n).collect();
        nodes_sorted.sort_unstable();
        for node in nodes_sorted {
            let ls = &lanes[&(j.id, node)];
            let mut k = 0;
            while k < ls.len() {
                let mut e = k;
                while e + 1 < ls.len() && ls[e + 1] == ls[e] + 1 {
                    e += 1;
                }
                let row0 = f64::from(node) * f64::from(cpus) + f64::from(ls[k]);
                let y0 = TOP + row0 * lane_h;
                let y1 = y0 + f64::from(ls[e] - ls[k] + 1) * lane_h;
                match rects.last_mut() {
                    Some((_, last_end)) if (*last_end - y0).abs() < 1e-9 => *last_end = y1,
                    _ => rects.push((y0, y1)),
                }
                k = e + 1;
            }
        }
        let _ = write!(out, r##"<g fill="{}" stroke="#333" stroke-width="0.3"><title>{title}</title>"##, colour(j.id));
        for (y0, y1) in rects {
            let _ = write!(
                out,
                r#"<rect x="{x0:.2}" y="{y0:.2}" width="{:.2}" height="{:.2}"/>"#,
                (x1 - x0).max(0.3),
                y1 - y0
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    out
}

/// Time-weighted means of a step function over `buckets` equal intervals of [from, to].
fn bucket_means(points: &[(u64, f64)], from: u64, to: u64, buckets: usize) -> Vec<f64> {
    let span = (to - from).max(1) as f64;
    let width = span / buckets as f64;
    let mut area = vec![0.0; buckets];
    for (k, &(t, v)) in points.iter().enumerate() {
        let next = points.get(k + 1).map_or(to, |p| p.0).min(to);
        let (mut a, b) = ((t.max(from) - from) as f64, (next.max(from) - from) as f64);
        while a < b {
            let i = ((a / width) as usize).min(buckets - 1);
            let edge = ((i + 1) as f64 * width).min(b);
            area[i] += v * (edge - a);
            a = if edge > a { edge } else { b };
        }
    }
    area.into_iter().map(|x| x / width).collect()
}

/// Queue length and utilization over the replay.
pub fn plot(result: &SimResult) -> String {
    let samples = &result.samples;
    let from = samples.first().map_or(0, |s| s.t_s);
    let to = samples.last().map_or(1, |s| s.t_s).max(from + 1);
    let buckets = 1000;
    let total = result.machine.total_cpus().max(1) as f64;
    let queue =
        bucket_means(&samples.iter().map(|s| (s.t_s, f64::from(s.pending))).collect::<Vec<_>>(), from, to, buckets);
    let util = bucket_means(
        &samples.iter().map(|s| (s.t_s, s.busy_cpus as f64 / total * 100.0)).collect::<Vec<_>>(),
        from,
        to,
        buckets,
    );
    let panel_h = 220.0;
    let gap = 50.0;
    let (w, h) = (LEFT + PLOT_W + 20.0, TOP + 2.0 * panel_h + gap + 40.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif">"#
    );
    let x = |t: u64| LEFT + (t.clamp(from, to) - from) as f64 / (to - from) as f64 * PLOT_W;
    let queue_max = queue.iter().copied().fold(1.0f64, f64::max).ceil();
    let panels = [
        ("waiting jobs (time-weighted mean)", &queue, queue_max, TOP, "#3366cc", false),
        ("utilization, % of CPUs busy", &util, 100.0, TOP + panel_h + gap, "#dc3912", true),
    ];
    for (label, values, max, y0, stroke, percent) in panels {
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{y0}" width="{PLOT_W}" height="{panel_h}" fill="#fafafa" stroke="#888" stroke-width="0.5"/><text x="{LEFT}" y="{:.0}" font-size="13">{label}</text>"##,
            y0 - 8.0
        );
        for k in 0..=4 {
            let v = max * f64::from(k) / 4.0;
            let y = y0 + panel_h - panel_h * f64::from(k) / 4.0;
            let text = if percent { format!("{v:.0}%") } else { format!("{v:.0}") };
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd" stroke-width="0.5"/><text x="{:.1}" y="{y:.1}" font-size="10" text-anchor="end" dominant-baseline="middle">{text}</text>"##,
                LEFT + PLOT_W,
                LEFT - 4.0
            );
        }
        time_axis(&mut out, from, to, x, y0, y0 + panel_h);
        let mut points = String::new();
        for (i, v) in values.iter().enumerate() {
            let px = LEFT + (i as f64 + 0.5) / buckets as f64 * PLOT_W;
            let py = y0 + panel_h - (v / max).min(1.0) * panel_h;
            let _ = write!(points, "{px:.1},{py:.1} ");
        }
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{stroke}" stroke-width="1" points="{}"/>"#,
            points.trim_end()
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_means_weigh_by_time() {
        // 0 until 50, 10 from 50 to 100: two buckets of 50 s.
        assert_eq!(bucket_means(&[(0, 0.0), (50, 10.0)], 0, 100, 2), vec![0.0, 10.0]);
        // A step in the middle of the only bucket averages.
        assert_eq!(bucket_means(&[(0, 0.0), (25, 4.0)], 0, 100, 1), vec![3.0]);
    }

    #[test]
    fn tick_steps_and_labels() {
        assert_eq!(tick_step(3600), 300);
        assert_eq!(tick_step(2 * 86_400), 21_600);
        assert_eq!(time_label(90_000), "1-01:00");
        assert_eq!(time_label(3_660), "01:01");
    }
}
