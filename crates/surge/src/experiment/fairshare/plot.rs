//! SVG line charts (plotters) for the fairshare report.

use plotters::prelude::*;
use std::path::Path;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Dashed reference line (e.g. the ideal ratio) instead of measured points.
    pub reference: bool,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
}

const COLORS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

fn bounds(series: &[Series]) -> (f64, f64, f64) {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        x1 = x0 + 1.0;
    }
    (x0, x1, if y1 > 0.0 { y1 * 1.1 } else { 1.0 })
}

/// Draw `series` into an SVG file at `path`.
pub fn line_chart(path: &Path, chart: &Chart, series: &[Series]) -> anyhow::Result<()> {
    let (x0, x1, y1) = bounds(series);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(chart.title, ("sans-serif", 20)).margin(15).x_label_area_size(40).y_label_area_size(60);
    if chart.log_x {
        let mut c = b.build_cartesian_2d((x0..x1).log_scale(), 0.0..y1).map_err(err)?;
        c.configure_mesh().x_desc(chart.x_label).y_desc(chart.y_label).draw().map_err(err)?;
        draw_series(&mut c, series)?;
        c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)?;
    } else {
        let mut c = b.build_cartesian_2d(x0..x1, 0.0..y1).map_err(err)?;
        c.configure_mesh().x_desc(chart.x_label).y_desc(chart.y_label).draw().map_err(err)?;
        draw_series(&mut c, series)?;
        c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn draw_series<'a, X, DB>(c: &mut ChartContext<'a, DB, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>, series: &[Series]) -> anyhow::Result<()>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    DB: DrawingBackend + 'a,
{
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        let line = if s.reference {
            c.draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, style)).map_err(err)?
        } else {
            c.draw_series(LineSeries::new(s.points.iter().copied(), style).point_size(3)).map_err(err)?
        };
        line.label(s.name.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}
