// The audit's reports: a human table with one column per side and one JSON object (the fields of
// sides[0] at the top level, the other sides under their backend name). Pure formatting of an
// AuditReport: the same report gives the same bytes.
#pragma once

#include <string>
#include <vector>

#include "engine/audit_workload.h"

namespace lockstep::engine {

struct AuditReport {
  std::string model;     // description (path or shape, config line)
  std::string devices;   // e.g. "rollout cuda (NVIDIA H200 ...), training cpu"; may be empty
  std::string contract;  // ContractConfig::to_string()
  AuditConfig config;
  std::vector<AuditSide> sides;  // sides[0] decides the exit status
  bool passed() const {
    return !sides.empty() && sides[0].mismatches == 0 && sides[0].entropy_mismatches == 0;
  }
};

std::string format_audit_report(const AuditReport& r);
std::string audit_report_json(const AuditReport& r);

}  // namespace lockstep::engine
