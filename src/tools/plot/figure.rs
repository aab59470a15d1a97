//! Drawing a grid of panels: each a figure of its runs' curves (a band of their spread, the
//! mean line), axes and legend, in PNG or SVG through plotters.
use std::ops::Range;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::tools::curves::Band;

const FONT: &[u8] = include_bytes!("../../../assets/DejaVuSans-subset.ttf");
const FONT_NAME: &str = "sans-serif";

pub(super) struct Series {
    pub(super) label: String,
    pub(super) band: Band,
    pub(super) runs: usize,
    pub(super) faint: bool,
}

pub(super) fn draw_grid<DB: DrawingBackend>(
    figures: &[Figure],
    root: DrawingArea<DB, Shift>,
    shape: (usize, usize),
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    // A grid with more cells than panels leaves the last ones white, not black.
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    root.split_evenly(shape)
        .into_iter()
        .zip(figures)
        .try_for_each(|(area, figure)| figure.draw(area))?;
    root.present().map_err(|e| e.to_string())
}

/// Rows and columns of a grid of `n` panels: as square as can be, wider than tall.
pub(super) fn grid(n: usize) -> (usize, usize) {
    let columns = (1..=n).find(|c| c * c >= n).unwrap_or(1);
    (n.div_ceil(columns), columns)
}

/// The runs grouped by configuration (seed aside), one series per group and phase, then the
/// reference (against agent steps only: the official results have no wall time).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(super) struct Figure<'a> {
    pub(super) title: &'a str,
    pub(super) x_label: &'a str,
    pub(super) y_label: &'a str,
    pub(super) series: &'a [Series],
}

impl Figure<'_> {
    /// The axes' ranges; values whose span no float holds (a foreign file's 1e308) are
    /// refused, naming the axis: the plotting library loops forever or panics on them.
    pub(super) fn ranges(&self) -> std::result::Result<(Range<f64>, Range<f64>), String> {
        let xs = self.series.iter().flat_map(|s| s.band.x.iter().copied());
        let ys = self
            .series
            .iter()
            .flat_map(|s| s.band.low.iter().chain(&s.band.high).copied());
        let span = |values: Vec<f64>, pad: f64, axis: &str| {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let width = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
            let range = (lo - pad * width)..(hi + pad * width);
            match range.start.is_finite() && range.end.is_finite() && width.is_finite() {
                true => Ok(range),
                false => Err(format!(
                    "{axis} values run from {lo:e} to {hi:e}, more than a plot can span"
                )),
            }
        };
        let x = span(xs.collect(), 0.0, self.x_label)?;
        let y = span(ys.collect(), 0.05, self.y_label)?;
        // One point only: give the x axis some width, none of it below 0 for steps from 0.
        let x = if x.end > x.start {
            x
        } else {
            let width = (x.start.abs() * 0.05).max(1.0);
            let start = x.start - width;
            (if x.start >= 0.0 {
                start.max(0.0)
            } else {
                start
            })..(x.end + width)
        };
        Ok((x, y))
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        register_font();
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        root.fill(&WHITE).map_err(err)?;
        let (x_range, y_range) = self.ranges()?;
        let spans = (x_range.end - x_range.start, y_range.end - y_range.start);
        let mut chart = ChartBuilder::on(&root)
            .caption(self.title, (FONT_NAME, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x_range, y_range)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .label_style((FONT_NAME, 14))
            .axis_desc_style((FONT_NAME, 16))
            .x_label_formatter(&|x| compact(*x, spans.0))
            .y_label_formatter(&|y| compact(*y, spans.1))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            if s.runs > 1 {
                let outline: Vec<(f64, f64)> = s
                    .band
                    .x
                    .iter()
                    .zip(&s.band.high)
                    .chain(s.band.x.iter().zip(&s.band.low).rev())
                    .map(|(x, y)| (*x, *y))
                    .collect();
                chart
                    .draw_series(std::iter::once(Polygon::new(outline, color.mix(0.18))))
                    .map_err(err)?;
            }
            let style = if s.faint {
                color.mix(0.55).stroke_width(1)
            } else {
                color.stroke_width(2)
            };
            let line: Vec<(f64, f64)> = s
                .band
                .x
                .iter()
                .copied()
                .zip(s.band.mean.iter().copied())
                .collect();
            // A line of one point draws nothing: a run evaluated once is a dot.
            if let [point] = line[..] {
                chart
                    .draw_series(std::iter::once(Circle::new(point, 4, style.filled())))
                    .map_err(err)?;
            }
            chart
                .draw_series(LineSeries::new(line, style))
                .map_err(err)?
                .label(&s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .label_font((FONT_NAME, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// Axis numbers without a tail of digits (12000 -> 12k, 0.25 -> 0.25), with as many as an axis
/// of `span` needs to tell its ticks apart (0.0005 -> 0.0005, not 0; 0.505 -> 0.505, not 0.5).
fn compact(v: f64, span: f64) -> String {
    // Ticks lie a tenth or a twentieth of the span apart: a digit more than a hundredth needs.
    let digits = |unit: f64| (-(span / unit / 100.0).log10()).ceil().clamp(0.0, 6.0) as usize;
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6, digits(1e6)))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3, digits(1e3)))
    } else {
        trim(v, digits(1.0))
    }
}

fn trim(v: f64, digits: usize) -> String {
    let s = format!("{v:.digits$}");
    let s = match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.'),
        false => &s,
    };
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and known to parse (the plot tests draw with it).
        let _ = plotters::style::register_font(FONT_NAME, FontStyle::Normal, FONT);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(compact(12000.0, 20000.0), "12k");
        assert_eq!(compact(200_000.0, 1e6), "200k");
        assert_eq!(compact(1_500_000.0, 2e6), "1.5M");
        assert_eq!(compact(0.25, 1.0), "0.25");
        assert_eq!(compact(-0.001, 1.0), "0");
        assert_eq!(compact(200.0, 1000.0), "200");
        // A small metric's ticks, and close ones, stay apart.
        assert_eq!(compact(0.00055, 0.00045), "0.00055");
        assert_eq!(compact(0.505, 0.01), "0.505");
    }
}
