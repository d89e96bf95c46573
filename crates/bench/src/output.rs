//! Output helpers the CLI's commands share with the benchmarks.

/// 1536 -> "1.5 KiB"
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Writes a command's output. A reader that went away (`rgpu devices | head -1`) ends the
/// output quietly instead of panicking like `println!` does.
pub fn write_stdout(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing the output: {e}"))
        }
        _ => Ok(()),
    }
}

/// One line of a [`line_plot`]: its label, its colour and its (size in bytes, value) points.
pub struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub points: Vec<(u64, f64)>,
}

/// An SVG plot of values against sizes (log scale), one line per series.
pub fn line_plot(title: &str, unit: &str, series: &[Series]) -> String {
    line_plot_with(title, unit, series, format_bytes)
}

/// [`line_plot`] with the x values (log scale) labelled by `x_label`.
pub fn line_plot_with(
    title: &str,
    unit: &str,
    series: &[Series],
    x_label: impl Fn(u64) -> String,
) -> String {
    use std::fmt::Write as _;
    let (w, h, left, bottom, top, right) = (640.0, 400.0, 70.0, 50.0, 40.0, 170.0);
    let mut sizes: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let peak = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1e-9, f64::max);
    let (lo, hi) = (
        sizes.first().map_or(1.0, |&s| (s as f64).log2()),
        sizes.last().map_or(2.0, |&s| (s as f64).log2()),
    );
    let x =
        |bytes: u64| left + ((bytes as f64).log2() - lo) / (hi - lo).max(1.0) * (w - left - right);
    let y = |value: f64| h - bottom - value / peak * (h - bottom - top);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">{title}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"10\" y=\"{top}\">{} {unit}</text>\n<text x=\"10\" y=\"{}\">0</text>\n",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        if peak >= 100.0 { format!("{peak:.0}") } else { format!("{peak:.2}") },
        h - bottom
    );
    for &bytes in &sizes {
        let _ = writeln!(
            svg,
            "<text x=\"{:.0}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(bytes),
            h - bottom + 18.0,
            x_label(bytes)
        );
    }
    for (i, line) in series.iter().filter(|s| !s.points.is_empty()).enumerate() {
        let points: Vec<String> = line
            .points
            .iter()
            .map(|&(b, v)| format!("{:.1},{:.1}", x(b), y(v)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>",
            line.color,
            points.join(" "),
            w - right + 10.0,
            top + 10.0 + 20.0 * i as f64,
            line.color,
            line.label
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// One bar of a [`bar_chart`] group: its label, its colour and its value.
pub struct Bar<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub value: f64,
}

/// An SVG chart of groups of bars (one group per measurement, one bar per way of running it),
/// each bar labelled with its value.
pub fn bar_chart(title: &str, unit: &str, groups: &[(&str, Vec<Bar>)]) -> String {
    use std::fmt::Write as _;
    let bars_per_group = groups.iter().map(|g| g.1.len()).max().unwrap_or(1).max(1);
    let (bar_w, gap, left, bottom, top) = (36.0, 30.0, 70.0, 110.0, 40.0);
    let group_w = bar_w * bars_per_group as f64 + gap;
    let (w, h) = (left + group_w * groups.len().max(1) as f64 + 150.0, 460.0);
    let peak = groups
        .iter()
        .flat_map(|g| g.1.iter().map(|b| b.value))
        .fold(1e-9, f64::max);
    let y = |value: f64| h - bottom - value / peak * (h - bottom - top);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">{title} ({unit})</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - bottom,
        w - 150.0,
        h - bottom
    );
    let mut legend: Vec<(&str, &str)> = Vec::new();
    for (g, (name, bars)) in groups.iter().enumerate() {
        let x0 = left + group_w * g as f64;
        for (i, bar) in bars.iter().enumerate() {
            let x = x0 + bar_w * i as f64;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                y(bar.value),
                bar_w - 4.0,
                h - bottom - y(bar.value),
                bar.color,
                x + bar_w / 2.0 - 2.0,
                y(bar.value) - 4.0,
                short_number(bar.value)
            );
            if !legend.iter().any(|(label, _)| *label == bar.label) {
                legend.push((bar.label, bar.color));
            }
        }
        // Slanted: long names (a link's settings) would run into their neighbours.
        let (lx, ly) = (x0 + (group_w - gap) / 2.0, h - bottom + 16.0);
        let _ = writeln!(
            svg,
            "<text x=\"{lx:.1}\" y=\"{ly}\" text-anchor=\"end\" \
             transform=\"rotate(-30 {lx:.1} {ly})\">{name}</text>"
        );
    }
    for (i, (label, color)) in legend.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>",
            w - 140.0,
            top + 10.0 + 20.0 * i as f64
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn short_number(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Writes each (file name, SVG) of `plots` into `dir` (created if missing).
pub fn write_plots(dir: &std::path::Path, plots: &[(&str, String)]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, svg) in plots {
        let path = dir.join(name);
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_chart_draws_each_bar_with_its_value_and_each_label_once() {
        let bar = |label, value| Bar {
            label,
            color: "red",
            value,
        };
        let svg = bar_chart(
            "Latency",
            "µs",
            &[
                ("read", vec![bar("native", 6.8), bar("rgpu", 24.4)]),
                ("launch", vec![bar("native", 8.0), bar("rgpu", 27.9)]),
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<rect x=").count(), 4);
        for value in ["6.80", "24.4", "8.00", "27.9"] {
            assert!(svg.contains(&format!(">{value}</text>")), "{value}");
        }
        // The legend names each way of running once.
        assert_eq!(svg.matches(">native</text>").count(), 1);
    }
}
