//! SVG plots with plotters: received rate against frame size, one line per
//! scenario, and the latency CDF of each scenario's latency trials.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Report, Status, TrialKind};

/// Errors of drawing.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {message}")]
pub struct PlotError {
    path: String,
    message: String,
}

fn err(path: &Path, e: impl std::fmt::Display) -> PlotError {
    PlotError {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

const COLOURS: [RGBColor; 6] = [BLACK, BLUE, RED, GREEN, MAGENTA, CYAN];

/// Received Mpps against the mean frame size on the wire.
pub fn throughput_vs_frame_size(report: &Report, path: &Path) -> Result<(), PlotError> {
    let series: Vec<(String, Vec<(f64, f64)>)> = report
        .scenarios
        .iter()
        .filter(|s| matches!(s.status, Status::Ran))
        .map(|s| {
            let mut pts: Vec<(f64, f64)> = s
                .trials
                .iter()
                .filter(|t| t.kind == TrialKind::Throughput)
                .map(|t| (t.mean_wire_size, t.rx_pps / 1e6))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (s.scenario.clone(), pts)
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let max_y = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(0.1f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Received rate vs frame size", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..1600f64, 0f64..max_y)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("frame size on the wire (bytes)")
        .y_desc("received Mpps")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, colour.filled())))
            .map_err(|e| err(path, e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// Latency CDF (percentile against µs) of each scenario's latency trial
/// at the first frame size that has one.
pub fn latency_cdf(report: &Report, path: &Path) -> Result<(), PlotError> {
    let series: Vec<(String, Vec<(f64, f64)>)> = report
        .scenarios
        .iter()
        .flat_map(|s| {
            s.trials
                .iter()
                .filter(|t| t.kind == TrialKind::Latency)
                .filter_map(move |t| {
                    t.latency.as_ref().map(|l| {
                        (
                            format!("{} {}", s.scenario, t.frame_size),
                            l.cdf.iter().map(|&(p, ns)| (ns as f64 / 1e3, p)).collect(),
                        )
                    })
                })
        })
        .collect();
    let max_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("One-way latency CDF (latency trials)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((1f64..max_x).log_scale(), 0f64..100f64)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("percentile")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(x, y)| (x.max(1.0), y)),
                colour.stroke_width(2),
            ))
            .map_err(|e| err(path, e))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}
