// The one table of sane ranges for the numbers a run takes from its command line and reads back
// from a checkpoint's manifest (issue 42, class 8). validate_options, the bias rate and the
// manifest reader all check through it, so NaN, inf, negative and absurdly large values are refused
// by name in the same words wherever they come from.
#pragma once
#include <string>

namespace moe::train {

struct ValueRange {
  const char* name;  // "--lr", or a manifest field: "field \"time_budget_steps\""
  double lo, hi;     // the range; lo is excluded when lo_open
  bool lo_open;
  bool zero_ok;      // 0 is also accepted (it means "off" or "default"), whatever lo is
  const char* low;   // what it must be, said when the value is below lo or not a number
  const char* high;  // why hi bounds it, said when the value is above hi ("": `low` says it)
};

// The entry for `name`; throws (an internal error) when the table has none.
const ValueRange& value_range(const std::string& name);

// Throws moe::Error unless v is in name's range: "[WHERE: ]NAME must be LOW, got V", or "[WHERE:
// ]NAME must be at most HI (HIGH), got V". `where` (a manifest's path) prefixes stored values.
void check_value(const std::string& name, double v, const std::string& where = "");

// The whole table, for a test that walks it (each entry once).
const ValueRange* value_ranges_begin();
const ValueRange* value_ranges_end();

}  // namespace moe::train
