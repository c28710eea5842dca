//! The SVG of a diagnosis: the gap at each output position, per hop; and, split by an
//! attribute, each value's gap p99 by output position.

use plotters::coord::Shift;
use plotters::prelude::*;
use streamgate::timeline::{Diagnosis, Slices};

/// The most values of an attribute the split chart draws (those whose stall rate stands out
/// most).
const MAX_SPLIT: usize = 8;

/// Draws, per hop, the longest gap (points) and the mean gap (line), in ms, at each output
/// position, as an SVG: bounded by the timeline's position limit, however many requests. With
/// `split` (slices by output position and an attribute), a second chart below draws each
/// value's gap p99 at the slices' hop per output position bucket.
pub fn plot(
    diagnosis: &Diagnosis,
    split: Option<&Slices>,
    file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let height = if split.is_some() { 1100 } else { 600 };
    let root = SVGBackend::new(file, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(600);
    per_hop(diagnosis, &top)?;
    if let Some(split) = split {
        by_value(split, &bottom)?;
    }
    root.present()?;
    Ok(())
}

/// The per-hop chart.
fn per_hop(
    diagnosis: &Diagnosis,
    root: &DrawingArea<SVGBackend<'_>, Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let positions = diagnosis
        .hops
        .iter()
        .map(|h| h.by_position.len() as u64)
        .max()
        .unwrap_or(0)
        .max(1);
    // Gaps run from microseconds to minutes: a log scale shows a 5 ms cadence and a 30 s
    // freeze on one chart.
    let gaps = || {
        diagnosis
            .hops
            .iter()
            .flat_map(|h| h.by_position.iter())
            .filter(|p| p.count > 0)
    };
    let max_ms = gaps().map(|p| ms(p.max)).fold(1.0, f64::max) * 1.5;
    let min_ms = gaps()
        .map(|p| ms(p.mean).min(ms(p.max)))
        .filter(|ms| *ms > 0.0)
        .fold(max_ms, f64::min)
        .min(1.0)
        / 1.5;
    let mut chart = ChartBuilder::on(root)
        .caption(
            "gap by output position, per hop (points: longest, line: mean)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..positions, (min_ms..max_ms).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("output position (visible event)")
        .y_desc("gap (ms, log scale)")
        .draw()?;
    for (index, hop) in diagnosis.hops.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let gaps = || {
            hop.by_position
                .iter()
                .enumerate()
                .filter(|(_, gap)| gap.count > 0)
                .map(|(position, gap)| (position as u64, gap))
        };
        let floor = |ms: f64| ms.max(min_ms);
        chart
            .draw_series(
                gaps()
                    .map(|(position, gap)| Circle::new((position, ms(gap.max)), 2, color.filled())),
            )?
            .label(hop.hop.as_str())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        chart.draw_series(LineSeries::new(
            gaps().map(|(position, gap)| (position, floor(ms(gap.mean)))),
            color.stroke_width(1),
        ))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}

/// The split chart: per value of the attribute (the second key of `split`), its gap p99 in
/// each output position bucket (the first key), on log scales.
fn by_value(
    split: &Slices,
    root: &DrawingArea<SVGBackend<'_>, Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    // A bucket's label is `LOW-HIGH`; its place on the axis, its index (0: 0-63, 1: 64-127, ...).
    let index = |label: &str| -> u64 {
        let low: u64 = label
            .split('-')
            .next()
            .and_then(|low| low.parse().ok())
            .unwrap_or(0);
        u64::from((64 - low.leading_zeros()).saturating_sub(6))
    };
    let mut values: Vec<&str> = Vec::new();
    for row in &split.rows {
        if !values.contains(&row.values[1].as_str()) {
            values.push(&row.values[1]);
        }
    }
    let shown = values.len().min(MAX_SPLIT);
    let series: Vec<(&str, Vec<(u64, f64)>)> = values[..shown]
        .iter()
        .map(|&value| {
            let points = split
                .rows
                .iter()
                .filter(|row| row.values[1] == value)
                .filter_map(|row| Some((index(&row.values[0]), ms(row.gap_p99?))))
                .collect();
            (value, points)
        })
        .collect();
    let all = || series.iter().flat_map(|(_, points)| points.iter().copied());
    let last = all().map(|(x, _)| x).max().unwrap_or(0).max(1);
    let max_ms = all().map(|(_, y)| y).fold(1.0, f64::max) * 1.5;
    let min_ms = all()
        .map(|(_, y)| y)
        .filter(|y| *y > 0.0)
        .fold(max_ms, f64::min)
        .min(1.0)
        / 1.5;
    let key = split.by[1].to_string();
    let caption = if shown < values.len() {
        format!(
            "gap p99 at {} by output position, per {key} ({shown} of {} values)",
            split.hop,
            values.len()
        )
    } else {
        format!("gap p99 at {} by output position, per {key}", split.hop)
    };
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..last + 1, (min_ms..max_ms).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("output position (from; each bucket twice the one before)")
        .x_label_formatter(&|i| match i {
            0 => "0".to_owned(),
            i => (1u64 << (i + 5).min(63)).to_string(),
        })
        .y_desc("gap p99 (ms, log scale)")
        .draw()?;
    for (n, (value, points)) in series.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(format!("{key}={value}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}
