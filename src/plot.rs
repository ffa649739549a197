//! PNG charts drawn with plotters and an embedded font (no system fonts needed): grouped bars
//! for `ember compare`, lines for training curves.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Colours of the series, in order.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(214, 92, 36),
    RGBColor(45, 110, 180),
    RGBColor(120, 170, 220),
    RGBColor(90, 160, 90),
    RGBColor(150, 100, 170),
    RGBColor(120, 120, 120),
];

/// Errors drawing a chart; they name the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot draw chart: {reason}", path.display())]
pub struct PlotError {
    pub path: std::path::PathBuf,
    pub reason: String,
}

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            unreachable!("the embedded DejaVu Sans parses");
        }
    });
}

fn err(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |reason| PlotError {
        path: path.to_owned(),
        reason,
    }
}

/// One bar series: a name and a value (None: no bar) per group.
pub struct BarSeries {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Draws a `size` chart with `draw` in memory, then writes it to `path` as a PNG through
/// [`write_atomic`](crate::files::write_atomic): a process killed while drawing leaves the
/// previous chart (or none), never a half-written one.
fn png(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    register();
    let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
    draw(BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area())?;
    let e = err(path);
    let mut bytes = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut bytes),
        &pixels,
        size.0,
        size.1,
        image::ExtendedColorType::Rgb8,
    )
    .map_err(|x| e(x.to_string()))?;
    crate::files::write_atomic(path, &bytes).map_err(|x| e(x.error.to_string()))
}

/// Grouped vertical bars with the value printed above each bar.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[BarSeries],
) -> Result<(), PlotError> {
    png(path, (1000, 560), |root| {
        let e = err(path);
        root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
        let top = series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .filter(|v| plottable(**v))
            .fold(0f64, |m, &v| m.max(v))
            .max(1e-9)
            * 1.18;
        let n = series.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FAMILY, 22))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..groups.len() as f64, 0f64..top)
            .map_err(|x| e(x.to_string()))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(y_label)
            .label_style((FAMILY, 15))
            .draw()
            .map_err(|x| e(x.to_string()))?;
        for (g, name) in groups.iter().enumerate() {
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    (g as f64 + 0.42, -top * 0.03),
                    (FAMILY, 16).into_font(),
                )))
                .map_err(|x| e(x.to_string()))?;
        }
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let width = 0.8 / n;
            let shown = |v: &Option<f64>| v.filter(|v| plottable(*v));
            let bars = s.values.iter().enumerate().filter_map(|(g, v)| {
                shown(v).map(|v| {
                    let x0 = g as f64 + 0.1 + i as f64 * width;
                    Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], color.filled())
                })
            });
            chart
                .draw_series(bars)
                .map_err(|x| e(x.to_string()))?
                .label(s.name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
            let labels = s.values.iter().enumerate().filter_map(|(g, v)| {
                shown(v).map(|v| {
                    let x0 = g as f64 + 0.1 + i as f64 * width;
                    Text::new(format_value(v), (x0, v + top * 0.01), (FAMILY, 13).into_font())
                })
            });
            chart.draw_series(labels).map_err(|x| e(x.to_string()))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 15))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|x| e(x.to_string()))?;
        root.present().map_err(|x| e(x.to_string()))
    })
}

/// Whether a value can be placed on a chart: finite and small enough that an axis range around
/// it is finite too, with room for its tick labels. plotters loops forever on an infinite or
/// degenerate range (a metrics.csv row holding `inf` or 1e308).
fn plottable(v: f64) -> bool {
    v.is_finite() && v.abs() <= 1e15
}

/// A finite range around `[low, high]` that plotters can tick: widened by `pad` of its width
/// each side; a single value (or a spread below f64's resolution there) centred in a range of
/// at least 1; `[0, 1]` when there is nothing.
fn axis_range(low: f64, high: f64, pad: f64) -> (f64, f64) {
    if low > high {
        return (0.0, 1.0);
    }
    let width = high - low;
    if width <= 1e-9 * low.abs().max(high.abs()) {
        let half = (0.05 * low.abs()).max(0.5);
        return (low - half, high + half);
    }
    (low - width * pad, high + width * pad)
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// One line: a name and (x, y) points, drawn in [`PALETTE`]`[colour]` (so that a series keeps
/// its colour from panel to panel), with dots on its points when `dots`.
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub colour: usize,
    pub dots: bool,
}

/// Panels side by side, each with its own lines, sharing the x axis label.
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub lines: Vec<Line>,
    /// The legend's corner: the upper right for falling curves (loss), the lower right for
    /// rising ones (accuracy), where the curves are not at their ends.
    pub legend_low: bool,
}

/// Line charts side by side in one PNG (e.g. loss and accuracy per epoch).
pub fn line_panels(path: &Path, x_label: &str, panels: &[Panel]) -> Result<(), PlotError> {
    png(path, (560 * panels.len() as u32, 420), |root| {
        let e = err(path);
        root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
        let areas = root.split_evenly((1, panels.len()));
        for (area, panel) in areas.iter().zip(panels) {
            // Points that cannot be drawn (infinite, NaN, beyond 1e15) are left out.
            let lines: Vec<Vec<(f64, f64)>> = panel
                .lines
                .iter()
                .map(|l| {
                    l.points
                        .iter()
                        .copied()
                        .filter(|&(x, y)| plottable(x) && plottable(y))
                        .collect()
                })
                .collect();
            let points = || lines.iter().flatten();
            let (x_min, x_max) = points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
            let (y_min, y_max) = points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
            let (x_min, x_max) = axis_range(x_min, x_max, 0.0);
            let (y_min, y_max) = axis_range(y_min, y_max, 0.08);
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, (FAMILY, 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x_min..x_max, y_min..y_max)
                .map_err(|x| e(x.to_string()))?;
            chart
                .configure_mesh()
                .x_labels(((x_max - x_min).round() as usize + 1).clamp(2, 12))
                .x_label_formatter(&|x| {
                    if (x - x.round()).abs() < 1e-9 {
                        format!("{x:.0}")
                    } else {
                        String::new()
                    }
                })
                .x_desc(x_label)
                .y_desc(&panel.y_label)
                .label_style((FAMILY, 14))
                .draw()
                .map_err(|x| e(x.to_string()))?;
            for (line, points) in panel.lines.iter().zip(&lines) {
                let color = PALETTE[line.colour % PALETTE.len()];
                let width = if line.dots { 2 } else { 1 };
                chart
                    .draw_series(plotters::series::LineSeries::new(
                        points.iter().copied(),
                        color.stroke_width(width),
                    ))
                    .map_err(|x| e(x.to_string()))?
                    .label(line.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
                    });
                if line.dots {
                    chart
                        .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(|x| e(x.to_string()))?;
                }
            }
            chart
                .configure_series_labels()
                .position(if panel.legend_low {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperRight
                })
                .background_style(WHITE.mix(0.7))
                .border_style(BLACK)
                .label_font((FAMILY, 14))
                .draw()
                .map_err(|x| e(x.to_string()))?;
        }
        root.present().map_err(|x| e(x.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Infinite, NaN and huge values are left out of a chart (plotters looped forever on the
    /// axis range they made); a single value gets a range around it. Drawn on a thread so that
    /// a regression fails after a minute instead of hanging.
    #[test]
    fn values_that_cannot_be_drawn_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.png");
        let (done, wait) = std::sync::mpsc::channel();
        let drawn = path.clone();
        std::thread::spawn(move || {
            let line = |points: Vec<(f64, f64)>| Panel {
                title: "loss".into(),
                y_label: "nll".into(),
                lines: vec![Line {
                    name: "train".into(),
                    points,
                    colour: 0,
                    dots: true,
                }],
                legend_low: false,
            };
            let result = line_panels(
                &drawn,
                "epoch",
                &[
                    line(vec![
                        (1.0, 0.3),
                        (2.0, f64::INFINITY),
                        (3.0, 1e308),
                        (4.0, -1e308),
                        (5.0, f64::NAN),
                    ]),
                    line(vec![(1.0, 1e15)]),
                    line(vec![(f64::INFINITY, 1.0)]),
                ],
            );
            let bars = bar_chart(
                &drawn.with_extension("bars.png"),
                "t",
                "ms",
                &["a".into()],
                &[BarSeries {
                    name: "x".into(),
                    values: vec![Some(f64::INFINITY)],
                }],
            );
            done.send((result.is_ok(), bars.is_ok())).unwrap();
        });
        let drawn = wait.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(drawn, Ok((true, true)), "not drawn within a minute");
        assert!(std::fs::metadata(&path).unwrap().len() > 5_000);
        assert_eq!(axis_range(2.0, 2.0, 0.1), (1.5, 2.5));
        assert_eq!(axis_range(1.0, 3.0, 0.5), (0.0, 4.0));
        assert_eq!(axis_range(f64::MAX, f64::MIN, 0.1), (0.0, 1.0));
    }

    #[test]
    fn draws_bars_and_lines_to_png() {
        let dir = tempfile::tempdir().unwrap();
        let bars = dir.path().join("bars.png");
        bar_chart(
            &bars,
            "step time",
            "ms",
            &["net64".into(), "flash64".into()],
            &[
                BarSeries {
                    name: "ember".into(),
                    values: vec![Some(180.0), Some(170.0)],
                },
                BarSeries {
                    name: "pytorch".into(),
                    values: vec![Some(45.0), None],
                },
            ],
        )
        .unwrap();
        let lines = dir.path().join("lines.png");
        line_panels(
            &lines,
            "epoch",
            &[Panel {
                title: "loss".into(),
                y_label: "nll".into(),
                lines: vec![Line {
                    name: "train".into(),
                    points: vec![(1.0, 0.3), (2.0, 0.1)],
                    colour: 0,
                    dots: true,
                }],
                legend_low: false,
            }],
        )
        .unwrap();
        for p in [bars, lines] {
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(&bytes[1..4], b"PNG", "{}", p.display());
            assert!(bytes.len() > 5_000, "{} is {} bytes", p.display(), bytes.len());
        }
    }
}
