//! Server-rendered charts: the geometry of stacked bar charts as plain numbers the templates
//! draw as SVG, so a chart needs no script and every label is escaped like any page text.
//! Pure.

use std::collections::BTreeMap;

/// One coloured piece of a bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub y: f64,
    pub height: f64,
    /// Index into the palette (the series' position in the legend).
    pub series: usize,
    /// Shown on hover, and read by screen readers.
    pub title: String,
}

/// One bar: an x position and its stacked segments, bottom first.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub x: f64,
    pub width: f64,
    pub label: String,
    pub segments: Vec<Segment>,
}

/// A stacked bar chart in a `WIDTH` × `HEIGHT` view box.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBars {
    pub bars: Vec<Bar>,
    /// Series names in palette order.
    pub legend: Vec<String>,
    /// The value the top of the chart stands for, as text with its unit.
    pub max_label: String,
}

pub const WIDTH: f64 = 600.0;
pub const HEIGHT: f64 = 200.0;
/// Distinct series colours; more series than this reuse them.
pub const PALETTE: usize = 8;

/// Stacks `values` (bar label → series → value) into bars, in label order, every series
/// in the same palette slot across bars. `unit` formats values for titles.
pub fn stacked(values: &BTreeMap<String, BTreeMap<String, f64>>, unit: impl Fn(f64) -> String) -> StackedBars {
    let mut legend: Vec<String> = values.values().flat_map(|s| s.keys().cloned()).collect();
    legend.sort();
    legend.dedup();
    let max = values.values().map(|s| s.values().sum::<f64>()).fold(0.0, f64::max);
    let scale = if max > 0.0 { HEIGHT / max } else { 0.0 };
    let slot = WIDTH / values.len().max(1) as f64;
    let bars = values
        .iter()
        .enumerate()
        .map(|(i, (label, series))| {
            let mut top = HEIGHT;
            let segments = series
                .iter()
                .filter(|(_, v)| **v > 0.0)
                .map(|(name, v)| {
                    let height = v * scale;
                    top -= height;
                    Segment {
                        y: top,
                        height,
                        series: legend.iter().position(|l| l == name).unwrap_or(0) % PALETTE,
                        title: format!("{name}: {} on {label}", unit(*v)),
                    }
                })
                .collect();
            Bar { x: i as f64 * slot + slot * 0.1, width: slot * 0.8, label: label.clone(), segments }
        })
        .collect();
    StackedBars { bars, legend, max_label: unit(max) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_stack_their_series_bottom_up_scaled_to_the_tallest_bar() {
        let values = BTreeMap::from([
            ("2026-11-01".to_owned(), BTreeMap::from([("ml".to_owned(), 30.0), ("nlp".to_owned(), 10.0)])),
            ("2026-11-02".to_owned(), BTreeMap::from([("nlp".to_owned(), 20.0)])),
        ]);
        let chart = stacked(&values, |v| format!("{v:.1} GPU-hours"));
        assert_eq!(chart.legend, ["ml", "nlp"]);
        assert_eq!(chart.max_label, "40.0 GPU-hours");
        let first = &chart.bars[0];
        assert_eq!(first.segments.len(), 2);
        assert_eq!((first.segments[0].y, first.segments[0].height), (50.0, 150.0), "ml: 30 of 40 at the bottom");
        assert_eq!((first.segments[1].y, first.segments[1].height), (0.0, 50.0));
        assert_eq!(first.segments[1].title, "nlp: 10.0 GPU-hours on 2026-11-01");
        // The same series keeps its colour across bars.
        assert_eq!(chart.bars[1].segments[0].series, 1);
        assert_eq!(chart.bars[1].segments[0].height, 100.0);
        assert!(chart.bars[1].x > first.x + first.width);
    }

    #[test]
    fn an_empty_chart_has_no_bars_and_no_division_by_zero() {
        let chart = stacked(&BTreeMap::new(), |v| format!("{v}"));
        assert!(chart.bars.is_empty());
        assert_eq!(chart.max_label, "0");
    }
}
