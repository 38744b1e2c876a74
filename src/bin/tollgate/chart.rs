//! The demo's chart: the bot's admitted requests per second under each algorithm, as an SVG.

use std::fmt::Write as _;

use crate::{BOT_START_NS, LIMIT, NS, Outcome};

/// A step of 1, 2 or 5 times a power of ten giving at most `max_ticks` ticks over `range`.
fn nice_step(range: f64, max_ticks: f64) -> f64 {
    let raw = (range / max_ticks).max(1e-9);
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow)
}

/// The chart's size and margins (pixels), and the line style of each series in turn.
const CHART_W: f64 = 960.0;
const CHART_H: f64 = 540.0;
const CHART_LEFT: f64 = 70.0;
const CHART_RIGHT: f64 = 230.0;
const CHART_TOP: f64 = 50.0;
const CHART_BOTTOM: f64 = 60.0;
const CHART_STYLES: [(&str, &str, f64); 5] = [
    ("#d62728", "", 2.5),
    ("#1f77b4", "8 4", 2.0),
    ("#2ca02c", "2 3", 2.0),
    ("#ff7f0e", "10 3 2 3", 2.0),
    ("#9467bd", "4 4", 1.5),
];

/// The plot area of a chart and its scales: seconds across, requests a second up.
struct Frame {
    /// Plot width and height.
    pw: f64,
    ph: f64,
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, s: f64) -> f64 {
        CHART_LEFT + s / self.x_max * self.pw
    }
    fn y(&self, v: f64) -> f64 {
        CHART_TOP + self.ph - v / self.y_max * self.ph
    }
}

/// The SVG `stroke-dasharray` attribute of a dash pattern (none for a solid line).
fn dash_attr(dash: &str) -> String {
    if dash.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{dash}""#)
    }
}

/// An SVG line chart of the bot's admitted requests per second (1-second bins), one polyline per
/// algorithm.
pub(crate) fn svg_chart(outcomes: &[Outcome], seconds: u64) -> String {
    let bins: Vec<Vec<u64>> = outcomes
        .iter()
        .map(|o| {
            let mut b = vec![0u64; seconds as usize];
            for &t in &o.bot_admitted {
                if let Some(slot) = b.get_mut((t / NS) as usize) {
                    *slot += 1;
                }
            }
            b
        })
        .collect();
    let peak = bins.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
    let y_step = nice_step(peak, 6.0);
    let x_max = seconds as f64;
    let frame = Frame {
        pw: CHART_W - CHART_LEFT - CHART_RIGHT,
        ph: CHART_H - CHART_TOP - CHART_BOTTOM,
        x_max,
        y_max: (peak / y_step).ceil() * y_step,
    };
    let (w, h) = (CHART_W, CHART_H);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>
<text x="{:.1}" y="24" text-anchor="middle" font-size="16">Bot requests admitted per second (limit {LIMIT}/min, bot at 10,000 req/s from t = {} s)</text>"#,
        CHART_LEFT + frame.pw / 2.0,
        BOT_START_NS / NS
    );
    svg_axes(&mut s, &frame, nice_step(x_max, 12.0).max(1.0), y_step);
    // One polyline per algorithm, points at the bins' centres.
    for (i, b) in bins.iter().enumerate() {
        let (color, dash, width) = CHART_STYLES[i % CHART_STYLES.len()];
        let mut points = String::new();
        for (sec, &n) in b.iter().enumerate() {
            let _ = write!(
                points,
                "{:.1},{:.1} ",
                frame.x(sec as f64 + 0.5),
                frame.y(n as f64)
            );
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="{width}"{} points="{}"/>"#,
            dash_attr(dash),
            points.trim_end()
        );
    }
    svg_legend(&mut s, &frame, outcomes);
    s.push_str("</svg>\n");
    s
}

/// The grid, ticks, tick labels, axes and axis labels of a chart.
fn svg_axes(s: &mut String, f: &Frame, x_step: f64, y_step: f64) {
    let (left, top) = (CHART_LEFT, CHART_TOP);
    let mut v = 0.0;
    while v <= f.y_max + 1e-9 {
        let yy = f.y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
            left + f.pw,
            left - 6.0,
            yy + 4.0
        );
        v += y_step;
    }
    let mut t = 0.0;
    while t <= f.x_max + 1e-9 {
        let xx = f.x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#e0e0e0"/>
<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t}</text>"##,
            top + f.ph,
            top + f.ph + 18.0
        );
        t += x_step;
    }
    let _ = writeln!(
        s,
        r#"<line x1="{left:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>
<line x1="{left:.1}" y1="{top:.1}" x2="{left:.1}" y2="{:.1}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">virtual time (s)</text>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">bot requests admitted per second</text>"#,
        top + f.ph,
        left + f.pw,
        top + f.ph,
        top + f.ph,
        left + f.pw / 2.0,
        CHART_H - 16.0,
        top + f.ph / 2.0,
        top + f.ph / 2.0
    );
}

/// The legend: each algorithm's name beside its line style.
fn svg_legend(s: &mut String, f: &Frame, outcomes: &[Outcome]) {
    let lx = CHART_LEFT + f.pw + 20.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{:.1}" font-weight="bold">algorithm</text>"#,
        CHART_TOP + 10.0
    );
    for (i, o) in outcomes.iter().enumerate() {
        let (color, dash, width) = CHART_STYLES[i % CHART_STYLES.len()];
        let ly = CHART_TOP + 32.0 + 22.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="{width}"{}/>
<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 36.0,
            dash_attr(dash),
            lx + 44.0,
            ly + 4.0,
            o.algorithm.name()
        );
    }
}
