//! The timeline of a plan's recommended candidate: MiB/s completed per
//! second on it against what the trace asked for in each second.

use crate::plan::WorkloadPlan;
use std::path::Path;
use surge_trace::Trace;

pub fn timeline_svg(p: &WorkloadPlan, t: &Trace, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let i = p.recommended.ok_or("no recommendation to plot")?;
    let row = &p.rows[i];
    let got = &row.replay.as_ref().ok_or("the recommended candidate has no replay")?.bytes_per_second;
    let asked: Vec<u64> = surge_trace::summary::per_second(&t.records).into_iter().map(|s| s.1).collect();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let n = got.len().max(asked.len()).max(1) as f64;
    let ymax = got.iter().chain(&asked).map(|&b| mib(b)).fold(1.0, f64::max) * 1.1;
    let e = |e: DrawingAreaErrorKind<std::io::Error>| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(format!("{} on {}: replayed {:.1} s (trace {:.1} s)", p.trace, row.spec.as_deref().unwrap_or(""), row.completion_s.unwrap_or(0.0), p.trace_duration_s), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n, 0.0..ymax)
        .map_err(e)?;
    ch.configure_mesh().x_desc("time (s)").y_desc("MiB/s").draw().map_err(e)?;
    ch.draw_series(LineSeries::new(asked.iter().enumerate().map(|(i, &b)| (i as f64, mib(b))), RED.stroke_width(1)))
        .map_err(e)?
        .label("the trace (submitted)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    ch.draw_series(LineSeries::new(got.iter().enumerate().map(|(i, &b)| (i as f64, mib(b))), BLUE.stroke_width(2)))
        .map_err(e)?
        .label("recommended candidate (completed)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
    ch.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
