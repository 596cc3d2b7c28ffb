#include "view_data.h"

// The structs are plain data; this file keeps the library's source list stable.
