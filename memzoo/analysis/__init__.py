"""Figure and table recipes over a results table (pandas + seaborn). Import as `memzoo.analysis`:

    from memzoo.analysis import load_results, footprint_vs_bpb, bpb_by_segment
    df = load_results("runs")            # every run folder's result.json under runs/
    footprint_vs_bpb(df).figure.savefig("footprint.png")

Every interval is the 95% t interval of the mean over seeds; every "differs" is a paired t-test over
seeds (Welch's where no seed is shared); memzoo.analysis.stats states them.
"""
from memzoo.analysis.capacity import (best_lr, capacity_curves, capacity_table, capacity_thresholds,
                                      is_capacity_table, pareto_front)
from memzoo.analysis.bpb import (headroom_recovered, memory_ablation, memory_gain, pairing_gain, range_differences,
                                 segment_differences, summary_table)
from memzoo.analysis.lm_figures import (bpb_by_segment, cost_per_method, footprint_vs_bpb, footprint_vs_gain,
                                         gain_by_segment, memory_vs_state)
from memzoo.analysis.gates import gate_heatmaps, gate_table
from memzoo.analysis.passkey import cost_vs_length, length_cost_table, longrange_table, passkey_heatmaps
from memzoo.analysis.results import load_results, long_by_segment, variant_labels
from memzoo.analysis.longrange import (accuracy_by_key_segment, answer_loss_curves, answer_loss_table, gate_summary,
                                       lm_before_after, passkey_by_length, passkey_length_curves,
                                       recall_generalisation)
from memzoo.analysis.distance import (distance_curves, distance_reach, distance_summary, distance_table,
                                      distance_versus, is_distance_table)
from memzoo.analysis.copy_distance import (copy_distance_figure, copy_distance_summary, copy_distance_table,
                                           copy_reach, is_copy_distance_table)
from memzoo.analysis.babilong import babilong_curves, babilong_summary, babilong_table, is_babilong_table
from memzoo.analysis.stats import compare_groups, mean_interval, paired_t, ratio_interval, welch_p, wilson_interval
from memzoo.analysis.bootstrap import bootstrap_versus, paired_bootstrap

__all__ = ["load_results", "long_by_segment", "summary_table", "footprint_vs_bpb", "bpb_by_segment",
           "cost_per_method", "gate_table", "gate_heatmaps", "longrange_table", "passkey_heatmaps", "cost_vs_length",
           "length_cost_table", "capacity_table", "capacity_thresholds", "capacity_curves", "best_lr", "pareto_front",
           "is_capacity_table", "compare_groups", "mean_interval", "welch_p", "wilson_interval", "passkey_by_length",
           "passkey_length_curves", "footprint_vs_gain", "gain_by_segment", "memory_gain", "memory_ablation", "memory_vs_state", "range_differences", "headroom_recovered", "ratio_interval", "pairing_gain", "segment_differences",
           "paired_t", "paired_bootstrap", "bootstrap_versus", "accuracy_by_key_segment", "answer_loss_table", "answer_loss_curves",
           "lm_before_after", "gate_summary", "recall_generalisation", "variant_labels", "is_distance_table",
           "distance_table", "distance_summary", "distance_reach", "distance_versus", "distance_curves",
           "is_babilong_table", "babilong_table", "babilong_summary", "babilong_curves", "copy_distance_table",
           "copy_distance_summary", "copy_reach", "copy_distance_figure", "is_copy_distance_table"]
