// `lockstep audit`, the main job: generate completions the way an RL rollout engine does
// (rollout.h, under one configuration), recompute their log-probs the way a training engine does
// (trainer.h, under another), and compare every generated token's fp32 log-prob (and entropy) bit
// for bit (memcmp). Optionally localizes the first divergence. Three parts:
//   audit_workload.h  the requests from fixed seeds, AuditConfig, one side's run (run_audit_side)
//   audit_compare.h   the bitwise comparison and the localization by activation traces
//   audit_report.h    the human and the JSON report
// The command line (flags, --help) is tools/audit_cmd.cc.
#pragma once

#include "engine/audit_compare.h"
#include "engine/audit_report.h"
#include "engine/audit_workload.h"
