# cmake -DSOURCE_DIR=<root> -P cmake/check_module_graph.cmake
#
# Checks the include graph of src/ against the module table of docs/architecture.md, so that the map a newcomer
# reads is the one the code follows. Each row of that table names a component in its first cell (`folder`, or
# `folder/stem` for a file pair that is its own library, such as `model/config`) and lists in its last cell the
# components it may include, each in backticks. Fails when
#   - a file under src/ belongs to no row,
#   - a file includes a component its row does not list,
#   - a row lists a component that is not on an earlier row (the rows are in dependency order, so the graph
#     has no cycle).
# Written in CMake so that CI needs nothing beyond the build's own tools.
cmake_minimum_required(VERSION 3.25)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<source root> -P check_module_graph.cmake")
endif()
# A relative root ("-DSOURCE_DIR=.") made GLOB_RECURSE find nothing, and a check of no file passes.
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)

# ---- the table: component -> allowed dependencies
file(READ "${SOURCE_DIR}/docs/architecture.md" doc)
string(REPLACE ";" "," doc "${doc}")  # a ';' would split CMake's list of lines
string(REPLACE "\n" ";" doc_lines "${doc}")
set(components "")
foreach(line IN LISTS doc_lines)
  if(NOT line MATCHES "^\\| `([a-z_]+(/[a-z_]+)?)` \\|")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  string(REGEX REPLACE "^.*\\|([^|]*)\\|[ ]*$" "\\1" last_cell "${line}")
  string(REGEX MATCHALL "`[a-z_]+(/[a-z_]+)?`" deps "${last_cell}")
  string(REPLACE "`" "" deps "${deps}")
  foreach(dep IN LISTS deps)
    if(NOT dep IN_LIST components)
      string(APPEND errors "docs/architecture.md: `${name}` depends on `${dep}`, which is not on an earlier row\n")
    endif()
  endforeach()
  string(REPLACE "/" "__" key "${name}")
  set(allowed_${key} "${deps}")
  list(APPEND components "${name}")
endforeach()
if(NOT components)
  message(FATAL_ERROR "docs/architecture.md: no module table found (rows of the form | `module` | ... |)")
endif()

# The component a path under src/ (or an include path) belongs to: `folder/stem` when that is a row, else
# `folder`; empty when the folder is no row.
function(component_of path out)
  set(result "")
  string(REGEX MATCH "^[a-z_]+" folder "${path}")
  if(folder IN_LIST components)
    set(result "${folder}")
  endif()
  if(path MATCHES "^([a-z_]+/[a-z_]+)\\.(h|cpp|cu|cuh)$")
    if(CMAKE_MATCH_1 IN_LIST components)
      set(result "${CMAKE_MATCH_1}")
    endif()
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# ---- the includes
file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}/src" "${SOURCE_DIR}/src/*.h" "${SOURCE_DIR}/src/*.cpp"
     "${SOURCE_DIR}/src/*.cu" "${SOURCE_DIR}/src/*.cuh")
if(NOT sources)
  message(FATAL_ERROR "no sources under ${SOURCE_DIR}/src: SOURCE_DIR must be the source root")
endif()
set(edges "")
foreach(source IN LISTS sources)
  component_of("${source}" from)
  if(NOT from)
    string(APPEND errors "src/${source}: its folder has no row in docs/architecture.md's module table\n")
    continue()
  endif()
  string(REPLACE "/" "__" from_key "${from}")
  file(STRINGS "${SOURCE_DIR}/src/${source}" includes REGEX "^#include \"[a-z_]+/")
  foreach(include IN LISTS includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" target "${include}")
    string(REGEX MATCH "^[a-z_]+" folder "${target}")
    if(NOT IS_DIRECTORY "${SOURCE_DIR}/src/${folder}")
      continue()  # not one of ours
    endif()
    component_of("${target}" to)
    if(to STREQUAL from)
      continue()
    endif()
    if(NOT to)
      string(APPEND errors "src/${source} includes \"${target}\": src/${folder} has no row\n")
    elseif(NOT to IN_LIST allowed_${from_key})
      string(APPEND errors "src/${source} includes \"${target}\": `${from}` does not list `${to}`\n")
    endif()
    list(APPEND edges "${from} -> ${to}")
  endforeach()
endforeach()

if(errors)
  message(NOTICE "The include graph does not match docs/architecture.md:\n${errors}")
  message(FATAL_ERROR "Change the code, or the table (and say why there).")
endif()
list(REMOVE_DUPLICATES edges)
list(LENGTH sources file_count)
list(LENGTH edges edge_count)
message(STATUS "module graph: ${file_count} files, ${edge_count} component edges, all in docs/architecture.md")
