//! The SVG of a diagnosis: the gap at each output position, per hop.

/// Draws, per hop, the longest gap (points) and the mean gap (line), in ms, at each output
/// position, as an SVG: bounded by the timeline's position limit, however many requests.
pub fn plot(
    diagnosis: &streamgate::timeline::Diagnosis,
    file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

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
    let root = SVGBackend::new(file, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
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
    root.present()?;
    Ok(())
}
