//! SVG plots: throughput and credit balance over time with swaps marked
//! (Figures 3 and 5), and IOPS / cost bars (Figure 1).

use super::report::{workloads, Results};
use surge_sim::threaded::{rates, Sample};
use super::{Run, Setting};
use plotters::prelude::*;
use std::path::Path;
use surge_block::model::MIB;

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}

const COLORS: [RGBColor; 3] = [RGBColor(220, 120, 0), RGBColor(30, 90, 200), RGBColor(30, 150, 60)];

pub fn all(out: &Path, s: &Setting, runs: &[Run], r: &Results) -> anyhow::Result<()> {
    timelines(&out.join("fig3_persistent.svg"), s, runs, &workloads(runs, false), &["single", "striped"], false)?;
    timelines(&out.join("fig5_cache.svg"), s, runs, &workloads(runs, true), &["none", "single", "striped"], true)?;
    fig1(&out.join("fig1.svg"), r)?;
    Ok(())
}

/// Minutes at full scale of a model time `t` (seconds since the window started).
fn minutes(s: &Setting, t: f64) -> f64 {
    t / s.scale / 60.0
}

/// Per workload: a throughput panel (all approaches; IOPS on a log axis, they
/// span 300 to 30,000) and a credit panel (every member of the striped volume,
/// and the single volume), swaps marked.
fn timelines(path: &Path, s: &Setting, runs: &[Run], loads: &[String], approaches: &[&str], mbps: bool) -> anyhow::Result<()> {
    if loads.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1000, 420 * loads.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (row, w) in root.split_evenly((loads.len(), 1)).iter().zip(loads) {
        let (top, bottom) = row.split_vertically(240);
        let first = |a: &str| runs.iter().find(|x| x.workload == *w && x.approach == a && x.run == 0);
        let series: Vec<(String, Vec<(f64, f64)>)> = approaches
            .iter()
            .filter_map(|a| first(a).map(|run| (a.to_string(), rates(&run.samples, |x: &Sample| if mbps { x.bytes } else { x.ops }))))
            .map(|(a, pts)| (a, pts.into_iter().map(|(t, v)| (minutes(s, t), if mbps { v / MIB as f64 } else { v })).collect()))
            .collect();
        let tmax = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.0)).fold(1.0, f64::max);
        let ymax = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.1)).fold(1.0, f64::max) * 1.15;
        let marks = first("striped").map(|run| swap_times(s, run)).unwrap_or_default();
        let mut cb = ChartBuilder::on(&top);
        cb.margin(8).x_label_area_size(28).y_label_area_size(70);
        if mbps {
            cb.caption(format!("{w}: throughput (virtual time, full-scale minutes)"), ("sans-serif", 17));
            let mut c = cb.build_cartesian_2d(0.0..tmax, 0.0..ymax).map_err(err)?;
            c.configure_mesh().x_desc("minutes").y_desc("MiB/s").draw().map_err(err)?;
            lines(&mut c, &series, &marks, 0.0, ymax, SeriesLabelPosition::UpperRight)?;
        } else {
            cb.caption(format!("{w}: throughput (virtual time, full-scale minutes; log scale)"), ("sans-serif", 17));
            let mut c = cb.build_cartesian_2d(0.0..tmax, (100.0..ymax * 1.5).log_scale()).map_err(err)?;
            c.configure_mesh().x_desc("minutes").y_desc("IOPS").draw().map_err(err)?;
            lines(&mut c, &series, &marks, 100.0, ymax * 1.5, SeriesLabelPosition::MiddleRight)?;
        }
        // Credits.
        let mut c = ChartBuilder::on(&bottom)
            .caption("burst balance (% of each member's bucket); swaps: dashed start, solid end", ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..tmax, 0.0..105.0)
            .map_err(err)?;
        c.configure_mesh().x_desc("minutes").y_desc("credits %").draw().map_err(err)?;
        let mut credit_series = Vec::new();
        for a in ["single", "striped"] {
            let Some(run) = first(a) else { continue };
            let members = run.samples.iter().map(|x| x.credits_pct.len()).max().unwrap_or(0);
            for m in 0..members {
                let pts: Vec<(f64, f64)> = run.samples.iter().filter_map(|x| x.credits_pct.get(m).filter(|v| v.is_finite()).map(|v| (minutes(s, x.t), *v))).collect();
                let name = if m == 0 { format!("{a} ({members} member{})", if members == 1 { "" } else { "s" }) } else { String::new() };
                credit_series.push((name, pts));
            }
        }
        let colored: Vec<(String, Vec<(f64, f64)>)> = credit_series;
        let n_single = colored.iter().take_while(|(n, _)| n.starts_with("single")).count();
        for (i, (name, pts)) in colored.iter().enumerate() {
            let color = if i < n_single { COLORS[0] } else { COLORS[2] };
            let line = c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(1))).map_err(err)?;
            if !name.is_empty() {
                line.label(name.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            }
        }
        marks_on(&mut c, &marks, 0.0, 105.0)?;
        c.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(SeriesLabelPosition::LowerRight).draw().map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

type Ctx<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

/// Throughput lines and swap marks on a linear or log y axis.
fn lines<'a, DB, Y>(c: &mut Ctx<'a, DB, Y>, series: &[(String, Vec<(f64, f64)>)], marks: &[(f64, bool)], y0: f64, y1: f64, legend: SeriesLabelPosition) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (i, (a, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(pts.iter().map(|&(t, v)| (t, v.max(y0))), color.stroke_width(2)))
            .map_err(err)?
            .label(a.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    marks_on(c, marks, y0, y1)?;
    c.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(legend).draw().map_err(err)?;
    Ok(())
}

/// Swap starts (dashed) and ends (solid), full-scale minutes; `true` = start.
fn swap_times(s: &Setting, run: &Run) -> Vec<(f64, bool)> {
    let mut starts: Vec<f64> = run.swaps.iter().map(|x| minutes(s, x.started_s - run.t0_s)).collect();
    let mut ends: Vec<f64> = run.swaps.iter().map(|x| minutes(s, x.finished_s - run.t0_s)).collect();
    starts.dedup_by(|a, b| (*a - *b).abs() < 0.05);
    ends.dedup_by(|a, b| (*a - *b).abs() < 0.05);
    starts.into_iter().map(|t| (t, true)).chain(ends.into_iter().map(|t| (t, false))).collect()
}

fn marks_on<'a, DB, Y>(c: &mut Ctx<'a, DB, Y>, marks: &[(f64, bool)], y0: f64, y1: f64) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for &(t, start) in marks {
        let pts = vec![(t, y0), (t, y1)];
        let style = BLACK.mix(0.6).stroke_width(1);
        if start {
            c.draw_series(DashedLineSeries::new(pts, 5, 4, style)).map_err(err)?;
        } else {
            c.draw_series(LineSeries::new(pts, style)).map_err(err)?;
        }
    }
    Ok(())
}

/// Figure 1: (a) IOPS of 500 GiB as N gp2 volumes, with full and spent
/// credits; (b) dollars per month at the measured striped IOPS.
fn fig1(path: &Path, r: &Results) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(560);
    let n = r.fig1.len().max(1);
    let ymax = r.fig1.iter().map(|p| p.iops_full_credits.max(p.iops_spent_credits)).fold(1.0, f64::max) * 1.15;
    let mut c = ChartBuilder::on(&left)
        .caption("(a) 500 GiB of gp2 as N volumes: 4 KiB random read IOPS", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(10)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, -ymax * 0.1..ymax)
        .map_err(err)?;
    c.configure_mesh().disable_x_mesh().x_labels(0).y_desc("IOPS").draw().map_err(err)?;
    let font = ("sans-serif", 13).into_font();
    for (i, p) in r.fig1.iter().enumerate() {
        let x = i as f64;
        c.draw_series([Rectangle::new([(x + 0.15, 0.0), (x + 0.48, p.iops_full_credits)], COLORS[1].filled())]).map_err(err)?;
        c.draw_series([Rectangle::new([(x + 0.52, 0.0), (x + 0.85, p.iops_spent_credits)], COLORS[0].filled())]).map_err(err)?;
        for (v, at) in [(p.iops_full_credits, x + 0.15), (p.iops_spent_credits, x + 0.52)] {
            c.draw_series([Text::new(format!("{v:.0}"), (at, v + ymax * 0.02), font.clone())]).map_err(err)?;
        }
        c.draw_series([Text::new(format!("{} x {} GiB", p.members, p.member_gib), (x + 0.2, -ymax * 0.06), font.clone())]).map_err(err)?;
    }
    c.draw_series([Rectangle::new([(0.0, 0.0), (0.0, 0.0)], COLORS[1].filled())]).map_err(err)?.label("full credits").legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], COLORS[1].filled()));
    c.draw_series([Rectangle::new([(0.0, 0.0), (0.0, 0.0)], COLORS[0].filled())]).map_err(err)?.label("spent credits").legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], COLORS[0].filled()));
    c.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(SeriesLabelPosition::UpperLeft).draw().map_err(err)?;
    // (b) cost at equal IOPS.
    let mut bars: Vec<(String, f64)> = vec![("striped gp2".into(), r.equal.striped_usd_month)];
    bars.extend(r.equal.others.iter().map(|(k, (usd, _))| (k.clone(), *usd)));
    let ymax = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
    let nb = bars.len();
    let mut c = ChartBuilder::on(&right)
        .caption(format!("(b) $/month at {:.0} IOPS, 100 GiB (log)", r.equal.iops), ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(10)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..nb as f64, (0.6..ymax * 1.5).log_scale())
        .map_err(err)?;
    c.configure_mesh().disable_x_mesh().x_labels(0).y_desc("$ per month").draw().map_err(err)?;
    for (i, (name, usd)) in bars.iter().enumerate() {
        let x = i as f64;
        c.draw_series([Rectangle::new([(x + 0.2, 1.0), (x + 0.8, usd.max(1.0))], COLORS[if i == 0 { 1 } else { 0 }].filled())]).map_err(err)?;
        c.draw_series([Text::new(format!("${usd:.2}"), (x + 0.25, usd.max(1.0) * 1.15), font.clone())]).map_err(err)?;
        c.draw_series([Text::new(name.clone(), (x + 0.22, 0.85), font.clone())]).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
