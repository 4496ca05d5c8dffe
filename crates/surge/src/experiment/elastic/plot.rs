//! The replica's plots: I/O activity per approach, AGBs over time (the
//! typical run of each approach: the one with the median completion time).

use super::replica::{Approach, Sample, Setting, Summary};
use std::path::Path;
use surge_block::model::MB;

/// MB/s in bins of `bin` full-scale seconds; `f` turns full-scale seconds
/// back into the run's (bandwidths are not scaled).
fn binned(samples: &[Sample], bin: f64, f: f64, get: impl Fn(&Sample) -> u64) -> Vec<(f64, f64)> {
    let end = samples.last().map_or(0.0, |s| s.t);
    let nb = (end / bin).ceil() as usize;
    let at = |t: f64| -> f64 {
        match samples.iter().position(|s| s.t >= t) {
            Some(0) => get(&samples[0]) as f64,
            Some(i) => {
                let (a, b) = (&samples[i - 1], &samples[i]);
                let w = if b.t > a.t { (t - a.t) / (b.t - a.t) } else { 1.0 };
                get(a) as f64 + w * (get(b) as f64 - get(a) as f64)
            }
            None => samples.last().map_or(0.0, |s| get(s) as f64),
        }
    };
    (0..nb).map(|i| (i as f64 * bin, (at((i + 1) as f64 * bin) - at(i as f64 * bin)) / (bin * f) / MB as f64)).collect()
}

const SHOWN: [Approach; 3] = [Approach::Slow, Approach::Fast, Approach::Adaptive];

pub fn io(path: &Path, s: &Setting, res: &[Summary]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 780)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let shown: Vec<&Summary> = SHOWN.iter().filter_map(|a| res.iter().find(|x| x.approach == *a)).collect();
    let tmax = shown.iter().flat_map(|r| r.typical().samples.last()).map(|x| x.t).fold(1.0, f64::max);
    for (panel, sum) in panels.iter().zip(shown) {
        let r = sum.typical();
        let name = sum.approach.name();
        let dev = binned(&r.samples, s.bin_s, s.scale, |x| x.device_bytes);
        let app = binned(&r.samples, s.bin_s, s.scale, |x| x.app_bytes);
        let ymax = dev.iter().chain(&app).map(|p| p.1).fold(10.0, f64::max) * 1.1;
        let mut ch = ChartBuilder::on(panel)
            .caption(format!("{name}: I/O activity ({} s bins, full-scale seconds; run {})", s.bin_s, r.rep), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..tmax, 0.0..ymax)?;
        ch.configure_mesh().x_desc("time (s, full scale)").y_desc("MB/s").draw()?;
        ch.draw_series(LineSeries::new(dev.iter().map(|p| (p.0, p.1)), BLUE.stroke_width(2)))?
            .label("all cloud volumes (reads + writes)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
        ch.draw_series(LineSeries::new(app.iter().map(|p| (p.0, p.1)), RED.stroke_width(1)))?
            .label("application")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
        if sum.approach == Approach::Adaptive {
            let mb = |b: u64| b as f64 / MB as f64;
            let k = ymax / mb(r.samples.iter().map(|x| x.cache_size).max().unwrap_or(1).max(1));
            ch.draw_series(LineSeries::new(r.samples.iter().map(|x| (x.t, mb(x.cache_size) * k)), GREEN.stroke_width(1)))?
                .label("cache volume attached (size, scaled to fit)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], GREEN));
        }
        ch.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

pub fn cost(path: &Path, res: &[Summary]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let shown: Vec<&Summary> = SHOWN.iter().filter_map(|a| res.iter().find(|x| x.approach == *a)).collect();
    let tmax = shown.iter().flat_map(|r| r.typical().samples.last()).map(|x| x.t).fold(1.0, f64::max);
    let ymax = shown.iter().flat_map(|r| r.typical().samples.iter()).map(|x| x.agbs).fold(1.0, f64::max) * 1.05;
    let mut ch = ChartBuilder::on(&root)
        .caption("Adjusted storage accumulation over time (full scale)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..tmax, 0.0..ymax)?;
    ch.configure_mesh().x_desc("time (s, full scale)").y_desc("AGBs").draw()?;
    for (sum, color) in shown.iter().zip([RED, BLUE, GREEN]) {
        ch.draw_series(LineSeries::new(sum.typical().samples.iter().map(|x| (x.t, x.agbs)), color.stroke_width(2)))?
            .label(sum.approach.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    ch.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
