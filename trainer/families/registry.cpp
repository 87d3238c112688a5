// The model families built into flowtrain. A family is its folder under trainer/families/ (a
// function `FamilySpec <name>_family()` there) and one entry in this list.
#include "trainer/family.h"

#define FLOWTRAIN_FAMILIES(X) \
  X(dit)                      \
  X(flux)                     \
  X(vae)

namespace flowtrain::trainer {

namespace families {
#define FLOWTRAIN_DECLARE_FAMILY(name) FamilySpec name##_family();
FLOWTRAIN_FAMILIES(FLOWTRAIN_DECLARE_FAMILY)
#undef FLOWTRAIN_DECLARE_FAMILY
}  // namespace families

std::vector<FamilySpec> builtin_families() {
#define FLOWTRAIN_LIST_FAMILY(name) families::name##_family(),
  return {FLOWTRAIN_FAMILIES(FLOWTRAIN_LIST_FAMILY)};
#undef FLOWTRAIN_LIST_FAMILY
}

}  // namespace flowtrain::trainer
