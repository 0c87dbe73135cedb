//! The benchmark sweep as a picture: IDs per second against concurrent callers, one line
//! per way of getting IDs (direct fast, direct classic, broker window, broker rounds, ...),
//! as an SVG file (`idctl chart`, written by `scripts/bench-ids.sh` for BENCHMARKS.md).
//!
//! The input is JSON lines, one run each, as the script writes them:
//! `{"series": "broker window", "callers": 64, "count": 1, "ids_per_sec": 51234, ...}`
//! (other fields are ignored; `clients` may stand for `callers`, as in `idctl bench`'s
//! output). Several runs of one series at the same callers are drawn as their mean. Both axes are logarithmic: callers go 1, 16, 64, 256 and
//! rates span several powers of ten.

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;
use std::io::BufRead;

/// One benchmark result: `series` at `callers` concurrent callers asking for `count` IDs per
/// request got `ids_per_sec`. `idctl bench`'s JSON line plus a `series` is one (its
/// `clients` are the callers).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BenchResult {
    pub series: String,
    #[serde(alias = "clients")]
    pub callers: u64,
    pub count: u64,
    pub ids_per_sec: f64,
}

/// Why a chart could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("cannot read the runs: {0}")]
    Read(#[from] std::io::Error),
    #[error("no run to draw (with count {count})")]
    Empty { count: u64 },
    #[error("drawing the chart: {0}")]
    Draw(String),
}

/// The benchmark results in JSON lines `input` (blank lines skipped).
///
/// # Errors
/// [`ChartError::BadLine`] naming the first line that is not a result (or has a negative or
/// non-finite rate, or zero callers); [`ChartError::Read`] if reading fails.
pub fn read_results(input: impl BufRead) -> Result<Vec<BenchResult>, ChartError> {
    let mut runs = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| ChartError::BadLine {
            line: i + 1,
            reason,
        };
        let run: BenchResult = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if !(run.ids_per_sec.is_finite() && run.ids_per_sec >= 0.0) {
            return Err(bad(format!(
                "ids_per_sec {} is not a rate",
                run.ids_per_sec
            )));
        }
        if run.callers == 0 {
            return Err(bad("callers is 0".to_string()));
        }
        runs.push(run);
    }
    Ok(runs)
}

/// The chart of the runs with `count` IDs per request, as an SVG document: one line per
/// series, in the order series first appear, with a legend.
///
/// # Errors
/// [`ChartError::Empty`] if no run has `count`; [`ChartError::Draw`] if plotters fails.
pub fn svg(runs: &[BenchResult], count: u64, title: &str) -> Result<String, ChartError> {
    let runs: Vec<&BenchResult> = runs.iter().filter(|r| r.count == count).collect();
    if runs.is_empty() {
        return Err(ChartError::Empty { count });
    }
    let scale = Scale::of(&runs);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let mut chart = axes(&root, title, &scale)?;
        for (i, name) in series_names(&runs).into_iter().enumerate() {
            let points = mean_by_callers(runs.iter().copied().filter(|r| r.series == name))
                .into_iter()
                .map(|(callers, rate)| (callers as f64, rate.max(scale.floor)))
                .collect::<Vec<_>>();
            draw_line(&mut chart, name, COLORS[i % COLORS.len()], points)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(out)
}

/// Both axes of a chart, logarithmic.
type LogLog = Cartesian2d<LogCoord<f64>, LogCoord<f64>>;

/// The axes' reach for some runs: callers up to `max_callers`, rates from `floor` to
/// `max_rate`.
struct Scale {
    max_callers: f64,
    floor: f64,
    max_rate: f64,
}

impl Scale {
    fn of(runs: &[&BenchResult]) -> Scale {
        debug_assert!(!runs.is_empty());
        let max_callers = runs.iter().map(|r| r.callers).max().unwrap_or(1) as f64;
        // The bottom of the log axis: the power of ten below half the lowest rate, at least
        // 1. A rate of 0 (a run that got nothing) sits on that edge.
        let lowest = runs
            .iter()
            .map(|r| r.ids_per_sec)
            .filter(|r| *r > 0.0)
            .fold(f64::INFINITY, f64::min);
        let floor = if lowest.is_finite() {
            10f64.powf((lowest / 2.0).log10().floor()).max(1.0)
        } else {
            1.0
        };
        let max_rate = runs.iter().map(|r| r.ids_per_sec).fold(floor, f64::max);
        Scale {
            max_callers,
            floor,
            max_rate,
        }
    }
}

/// The series of `runs`, in the order they first appear.
fn series_names<'r>(runs: &[&'r BenchResult]) -> Vec<&'r str> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !names.contains(&r.series.as_str()) {
            names.push(&r.series);
        }
    }
    names
}

/// A plotters failure as a [`ChartError::Draw`].
fn drawing(e: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// The titled chart area on `root` with its two labelled log axes and their mesh.
fn axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    scale: &Scale,
) -> Result<ChartContext<'a, SVGBackend<'b>, LogLog>, ChartError> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (1.0..scale.max_callers * 1.3).log_scale(),
            (scale.floor..scale.max_rate * 2.0).log_scale(),
        )
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc("concurrent callers")
        .y_desc("IDs per second")
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| human(*y))
        .draw()
        .map_err(drawing)?;
    Ok(chart)
}

/// One series: its line through `points` and a dot on each, in `color`, with a legend
/// entry named `name`.
fn draw_line(
    chart: &mut ChartContext<'_, SVGBackend<'_>, LogLog>,
    name: &str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
) -> Result<(), ChartError> {
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(drawing)?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
        .map_err(drawing)?;
    Ok(())
}

/// The mean rate of `runs` at each number of callers, by increasing callers.
fn mean_by_callers<'a>(runs: impl Iterator<Item = &'a BenchResult>) -> Vec<(u64, f64)> {
    let mut sums: std::collections::BTreeMap<u64, (f64, u32)> = Default::default();
    for r in runs {
        let e = sums.entry(r.callers).or_default();
        e.0 += r.ids_per_sec;
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(callers, (sum, n))| (callers, sum / f64::from(n)))
        .collect()
}

/// The series colours, in order (distinct, readable on white, colour-blind friendly).
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1F, 0x77, 0xB4),
    RGBColor(0xD6, 0x27, 0x28),
    RGBColor(0x2C, 0xA0, 0x2C),
    RGBColor(0x94, 0x67, 0xBD),
    RGBColor(0xFF, 0x7F, 0x0E),
    RGBColor(0x8C, 0x56, 0x4B),
];

/// 1234567 as "1.2M", 51234 as "51k".
fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNS: &str = r#"
{"series":"direct fast","mode":"direct","callers":1,"count":1,"ids_per_sec":900.5}
{"series":"direct fast","mode":"direct","callers":64,"count":1,"ids_per_sec":4100}
{"series":"direct fast","mode":"direct","clients":64,"count":1,"ids_per_sec":4300}
{"series":"broker window","mode":"broker","callers":1,"count":1,"ids_per_sec":1500}
{"series":"broker window","mode":"broker","callers":64,"count":1,"ids_per_sec":61000}
{"series":"broker rounds","mode":"broker","callers":64,"count":1,"ids_per_sec":30500}
{"series":"direct classic","mode":"direct","callers":64,"count":1,"ids_per_sec":0}
{"series":"direct fast","mode":"direct","callers":64,"count":1000,"ids_per_sec":4000000}
"#;

    fn runs() -> Vec<BenchResult> {
        read_results(RUNS.as_bytes()).expect("valid runs")
    }

    #[test]
    fn reads_runs_and_ignores_other_fields() {
        let r = runs();
        assert_eq!(r.len(), 8);
        assert_eq!(r[2].callers, 64, "clients stands for callers");
        assert_eq!(
            r[0],
            BenchResult {
                series: "direct fast".into(),
                callers: 1,
                count: 1,
                ids_per_sec: 900.5
            }
        );
    }

    #[test]
    fn bad_lines_are_named() {
        for (input, line) in [
            ("{\"series\":\"a\",\"callers\":1,\"count\":1}\n", 1),
            (
                "\n{\"series\":\"a\",\"callers\":0,\"count\":1,\"ids_per_sec\":1}",
                2,
            ),
            (
                "{\"series\":\"a\",\"callers\":1,\"count\":1,\"ids_per_sec\":-1}",
                1,
            ),
            ("not json", 1),
        ] {
            match read_results(input.as_bytes()) {
                Err(ChartError::BadLine { line: l, .. }) => assert_eq!(l, line, "{input}"),
                other => panic!("{input}: {other:?}"),
            }
        }
    }

    /// `doc` parsed by a real XML parser (python3's standard library): the text of every
    /// `<text>` and, per `<polyline>`, its colour and number of points.
    fn parse_svg(doc: &str) -> serde_json::Value {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ids.svg");
        std::fs::write(&path, doc).expect("write");
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys, json, xml.etree.ElementTree as E\n\
                 r = E.parse(sys.argv[1]).getroot()\n\
                 assert r.tag == '{http://www.w3.org/2000/svg}svg', r.tag\n\
                 tag = lambda e: e.tag.split('}')[-1]\n\
                 print(json.dumps({'texts': [e.text.strip() for e in r.iter() if tag(e) == 'text'],\n\
                   'lines': [[e.get('stroke'), len(e.get('points').split())] for e in r.iter() if tag(e) == 'polyline']}))",
            ])
            .arg(&path)
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "not a valid SVG document: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("python's JSON")
    }

    #[test]
    fn the_svg_is_valid_with_a_line_and_a_legend_entry_per_series() {
        let doc = svg(&runs(), 1, "IDs/s by callers").expect("chart");
        let parsed = parse_svg(&doc);
        let texts: Vec<&str> = parsed["texts"]
            .as_array()
            .expect("texts")
            .iter()
            .filter_map(|t| t.as_str())
            .collect();
        assert!(texts.contains(&"IDs/s by callers"), "{texts:?}");
        assert!(texts.contains(&"concurrent callers"), "{texts:?}");
        let lines: Vec<(String, u64)> = parsed["lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(|l| {
                (
                    l[0].as_str().unwrap_or("").to_string(),
                    l[1].as_u64().unwrap_or(0),
                )
            })
            .collect();
        // Each series: a legend entry, and a line through its runs in the series colour.
        for (i, (name, runs)) in [
            ("direct fast", 2),
            ("broker window", 2),
            ("broker rounds", 1),
            ("direct classic", 1),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(texts.contains(&name), "legend lacks {name}: {texts:?}");
            let RGBColor(r, g, b) = COLORS[i];
            let stroke = format!("#{r:02X}{g:02X}{b:02X}");
            assert!(
                lines.contains(&(stroke.clone(), runs)),
                "{name}: no {stroke} line of {runs} points in {lines:?}"
            );
        }
        // Only count-1 runs: the 4M IDs/s run of count 1000 is not on this chart.
        assert!(!texts.iter().any(|t| t.ends_with('M')), "{texts:?}");
    }

    #[test]
    fn no_run_with_that_count_is_an_error() {
        assert!(matches!(
            svg(&runs(), 7, "t"),
            Err(ChartError::Empty { count: 7 })
        ));
    }
}
