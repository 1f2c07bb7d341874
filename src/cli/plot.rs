//! `subagents load --plot FILE`: the run's timeline as a picture, SVG or PNG by the file's
//! extension. Four panels over one time axis — children in flight, epochs settled per second,
//! follow-ups accepted per second, the resident set — with the listing and the drain after the
//! growth shaded, under a title that names the scenario. A stretch in which the sampler missed its turns is left blank
//! rather than bridged by a line.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use subagents::load::{LoadReport, Sample};

/// The picture formats `--plot` writes, named by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlotFormat {
    Svg,
    Png,
}

impl PlotFormat {
    /// The format `path` names, or why it names none.
    pub(crate) fn of(path: &Path) -> Result<Self, String> {
        let extension = path
            .extension()
            .and_then(|extension| extension.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("svg") => Ok(Self::Svg),
            Some("png") => Ok(Self::Png),
            _ => Err("the plot is drawn as SVG or PNG: name a `.svg` or `.png` file".to_owned()),
        }
    }
}

/// The picture's size in pixels.
const SIZE: (u32, u32) = (1100, 1000);

/// The shade of what follows the growth: the forest's listing and the drain.
const DRAIN_SHADE: RGBColor = RGBColor(225, 225, 225);

/// A rate is taken over at least this fraction of the run (see [`Timeline::rates`]).
const RATE_WINDOWS: u64 = 200;

/// How many times the usual interval between two samples makes a gap (the sampler did not
/// get its turn): the line breaks there.
const GAP: f64 = 4.0;

/// The plot's text is laid out (and a PNG's drawn) with this font, carried in the binary:
/// DejaVu Sans, free to redistribute under the Bitstream Vera terms in `assets/fonts/LICENSE`.
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Why a plot was not drawn, for a person: a file that could not be written is no error of the
/// runtime's, so it has no code.
fn failed(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Draws `report`'s timeline into `path`, as SVG or PNG by its extension.
///
/// # Errors
/// Why it was not drawn: an extension that is neither, or a write that failed.
pub(crate) fn draw(report: &LoadReport, path: &Path) -> Result<(), String> {
    // Both formats lay their text out with it (the SVG's viewer then draws it in its own).
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| failed("the embedded font does not load"))?;
    match PlotFormat::of(path).map_err(failed)? {
        PlotFormat::Svg => draw_on(SVGBackend::new(path, SIZE).into_drawing_area(), report),
        PlotFormat::Png => draw_on(BitMapBackend::new(path, SIZE).into_drawing_area(), report),
    }
}

/// One panel: a series over time, in its unit.
struct Panel {
    title: &'static str,
    unit: &'static str,
    color: RGBColor,
    segments: Vec<Vec<(f64, f64)>>,
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    report: &LoadReport,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(failed)?;
    let title = format!("subagents load: {}", report.scenario_headline());
    let body = root.titled(&title, ("sans-serif", 15)).map_err(failed)?;
    let timeline = Timeline::new(&report.timeline);
    // After it grew, the forest is listed (for the reopening check), then drained.
    let drain = (
        report.elapsed_s,
        report.elapsed_s + report.listing_s + report.drain_s,
    );
    let end = timeline.end().max(drain.1).max(0.01);
    let panels = [
        Panel {
            title: "children in flight (epochs started, not yet settled)",
            unit: "children",
            color: RGBColor(200, 40, 40),
            segments: timeline.levels(|sample| {
                sample.started.saturating_sub(sample.settled) as f64
            }),
        },
        Panel {
            title: "epochs settled per second (an epoch: one child's run from start or follow-up to settled)",
            unit: "epochs/s",
            color: RGBColor(30, 80, 200),
            segments: timeline.rates(|sample| sample.settled),
        },
        Panel {
            title: "follow-ups accepted per second",
            unit: "follow-ups/s",
            color: RGBColor(20, 140, 60),
            segments: timeline.rates(|sample| sample.followups),
        },
        Panel {
            title: "resident set size of the process",
            unit: "MiB",
            color: RGBColor(120, 60, 160),
            segments: timeline.levels(|sample| sample.rss_bytes as f64 / f64::from(1 << 20)),
        },
    ];
    let areas = body.split_evenly((panels.len(), 1));
    for (area, panel) in areas.iter().zip(panels) {
        let top = panel
            .segments
            .iter()
            .flatten()
            .map(|(_, y)| *y)
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..end, 0.0..top)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first child started")
            .y_desc(panel.unit)
            .y_label_formatter(&|value| format!("{value:.0}"))
            .draw()
            .map_err(failed)?;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(drain.0, 0.0), (drain.1, top)],
                DRAIN_SHADE.filled(),
            )))
            .map_err(failed)?;
        chart
            .draw_series(std::iter::once(Text::new(
                "listing, drain",
                (drain.0, top * 0.97),
                ("sans-serif", 12),
            )))
            .map_err(failed)?;
        for segment in panel.segments {
            chart
                // One pixel wide: plotters joins a wider line's segments with miters, which
                // spike far out of the panel at a steep turn.
                .draw_series(LineSeries::new(segment, panel.color.stroke_width(1)))
                .map_err(failed)?;
        }
    }
    root.present().map_err(failed)
}

/// The samples with their times in seconds and where the sampler missed its turns.
struct Timeline<'a> {
    samples: &'a [Sample],
    /// Intervals longer than this are gaps.
    gap_s: f64,
}

impl<'a> Timeline<'a> {
    fn new(samples: &'a [Sample]) -> Self {
        let mut intervals: Vec<u64> = samples
            .windows(2)
            .map(|pair| pair[1].at_ms.saturating_sub(pair[0].at_ms))
            .collect();
        intervals.sort_unstable();
        let usual = intervals.get(intervals.len() / 2).copied().unwrap_or(0);
        Self {
            samples,
            // A run of two samples has no usual interval: nothing is a gap then.
            gap_s: if usual == 0 {
                f64::INFINITY
            } else {
                usual as f64 * GAP / 1000.0
            },
        }
    }

    fn end(&self) -> f64 {
        self.samples.last().map_or(0.0, seconds)
    }

    /// A level at each sample, the line broken at gaps.
    fn levels(&self, value: impl Fn(&Sample) -> f64) -> Vec<Vec<(f64, f64)>> {
        let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut previous: Option<f64> = None;
        for sample in self.samples {
            let at = seconds(sample);
            if previous.is_none_or(|previous| at - previous > self.gap_s) {
                segments.push(Vec::new());
            }
            if let Some(segment) = segments.last_mut() {
                segment.push((at, value(sample)));
            }
            previous = Some(at);
        }
        segments
    }

    /// The rate of `count` over successive windows of at least [`RATE_WINDOWS`]th of the run
    /// (and at least one sampling interval), at each window's end: a rate over a few
    /// milliseconds of a long run is noise. A gap has no rate and breaks the line.
    fn rates(&self, count: impl Fn(&Sample) -> u64) -> Vec<Vec<(f64, f64)>> {
        // In whole milliseconds, as the samples are timed: no rounding splits a window.
        let window_ms = self.samples.last().map_or(0, |last| last.at_ms) / RATE_WINDOWS;
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let mut previous: Option<&Sample> = None;
        let mut from: Option<&Sample> = None;
        for sample in self.samples {
            let at = seconds(sample);
            if previous.is_some_and(|previous| at - seconds(previous) > self.gap_s) {
                segments.push(Vec::new());
                from = None;
            }
            previous = Some(sample);
            let Some(start) = from else {
                from = Some(sample);
                continue;
            };
            let span_ms = sample.at_ms.saturating_sub(start.at_ms);
            if span_ms == 0 || span_ms < window_ms {
                continue;
            }
            let rate = count(sample).saturating_sub(count(start)) as f64 * 1000.0 / span_ms as f64;
            if let Some(segment) = segments.last_mut() {
                segment.push((at, rate));
            }
            from = Some(sample);
        }
        segments.retain(|segment| !segment.is_empty());
        segments
    }
}

fn seconds(sample: &Sample) -> f64 {
    sample.at_ms as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_ms: u64, settled: u64) -> Sample {
        Sample {
            at_ms,
            started: settled + 1,
            settled,
            ..Sample::default()
        }
    }

    #[test]
    fn a_gap_in_the_samples_breaks_every_line_instead_of_bridging_it() {
        // Every 10 ms, then nothing for 200 ms, then every 10 ms again.
        let samples = [at(0, 0), at(10, 5), at(20, 10), at(220, 12), at(230, 20)];
        let timeline = Timeline::new(&samples);
        let levels = timeline.levels(|sample| sample.settled as f64);
        assert_eq!(levels.len(), 2, "{levels:?}");
        assert_eq!(levels[1], vec![(0.22, 12.0), (0.23, 20.0)]);
        let rates = timeline.rates(|sample| sample.settled);
        assert_eq!(rates.len(), 2, "{rates:?}");
        assert_eq!(rates[0].len(), 2);
        // 8 settled in the 10 ms after the gap: 800 per second, not averaged over the gap.
        assert_eq!(rates[1].len(), 1);
        assert!((rates[1][0].1 - 800.0).abs() < 1e-6, "{rates:?}");
    }

    #[test]
    fn a_long_run_s_rate_is_taken_over_a_two_hundredth_of_it_not_per_sample() {
        // Ten seconds sampled every 10 ms, one epoch settled per sample: 100 per second.
        let samples: Vec<Sample> = (0..=1_000).map(|tick| at(tick * 10, tick)).collect();
        let rates = Timeline::new(&samples).rates(|sample| sample.settled);
        assert_eq!(rates.len(), 1);
        assert_eq!(rates[0].len(), 200, "one rate per 50 ms window");
        assert!(rates[0].iter().all(|(_, rate)| (rate - 100.0).abs() < 1e-6));
    }

    #[test]
    fn the_format_is_the_extension_and_anything_else_is_refused() {
        assert_eq!(PlotFormat::of(Path::new("run.svg")), Ok(PlotFormat::Svg));
        assert_eq!(PlotFormat::of(Path::new("RUN.PNG")), Ok(PlotFormat::Png));
        for refused in ["run.jpg", "run", "run.svg.txt"] {
            let why = PlotFormat::of(Path::new(refused)).expect_err(refused);
            assert!(why.contains("`.svg` or `.png`"), "{why}");
        }
    }
}
