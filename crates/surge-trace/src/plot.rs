//! An SVG of a trace over time: IOPS and MiB/s per second (reads + writes),
//! and where requests land (offset against time, a sample of them).

use crate::format::Op;
use crate::reader::Trace;
use crate::summary::per_second;
use std::path::Path;

/// Points of the offset scatter at most (a sample, evenly spaced).
const SCATTER: usize = 20_000;

pub fn svg(t: &Trace, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<std::io::Error>| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (top, bottom) = root.split_vertically(320);
    let secs = per_second(&t.records);
    let n = secs.len().max(1) as f64;
    let ymax = secs.iter().map(|s| s.0).max().unwrap_or(1).max(1) as f64 * 1.1;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mmax = secs.iter().map(|s| mib(s.1)).fold(1.0, f64::max) * 1.1;
    let mut ch = ChartBuilder::on(&top)
        .caption(format!("{}: requests and MiB per second{}", t.header.name, if t.header.aggregate { " (AGGREGATE import)" } else { "" }), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0.0..n, 0.0..ymax)
        .map_err(e)?
        .set_secondary_coord(0.0..n, 0.0..mmax);
    ch.configure_mesh().x_desc("time (s)").y_desc("IOPS").draw().map_err(e)?;
    ch.configure_secondary_axes().y_desc("MiB/s").draw().map_err(e)?;
    ch.draw_series(LineSeries::new(secs.iter().enumerate().map(|(i, s)| (i as f64, s.0 as f64)), BLUE.stroke_width(2)))
        .map_err(e)?
        .label("IOPS")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
    ch.draw_secondary_series(LineSeries::new(secs.iter().enumerate().map(|(i, s)| (i as f64, mib(s.1))), RED.stroke_width(1)))
        .map_err(e)?
        .label("MiB/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    ch.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;

    let data: Vec<_> = t.records.iter().filter(|r| r.op.moves_data()).collect();
    let step = (data.len() / SCATTER).max(1);
    let tmax = t.span_ns().max(1) as f64 / 1e9;
    let gmax = t.footprint().max(1) as f64 / (1u64 << 30) as f64;
    let mut sc = ChartBuilder::on(&bottom)
        .caption("where requests land (blue reads, red writes; a sample)", ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..tmax, 0.0..gmax)
        .map_err(e)?;
    sc.configure_mesh().x_desc("time (s)").y_desc("offset (GiB)").draw().map_err(e)?;
    let t0 = t.records.first().map_or(0, |r| r.t_ns);
    sc.draw_series(data.iter().step_by(step).map(|r| {
        let c = if r.op == Op::Read { BLUE } else { RED };
        Circle::new(((r.t_ns - t0) as f64 / 1e9, r.offset as f64 / (1u64 << 30) as f64), 1, c.filled())
    }))
    .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
