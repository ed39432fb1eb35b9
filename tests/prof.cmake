# prof: reader, classification, analyses, reports (host only), and the CLI's exit codes.
find_package(ZLIB REQUIRED)
molora_add_test(prof_test SOURCES prof_test.cc prof_reader_test.cc LIBS molora_prof ZLIB::ZLIB)
target_compile_definitions(prof_test PRIVATE MOLORA_TEST_DATA="${CMAKE_CURRENT_SOURCE_DIR}/data")

if(MOLORA_BUILD_CLI)
  set(_trace ${CMAKE_CURRENT_SOURCE_DIR}/data/prof_h200_decode.json.gz)
  if(EXISTS ${_trace})
    molora_add_output_test(prof_cli_summary_real "\"schema\": \"molora.prof.summary/1\""
      prof summary --json ${_trace})
    add_test(NAME prof_cli_steps_real COMMAND molora_cli prof steps ${_trace})
    set_tests_properties(prof_cli_steps_real PROPERTIES LABELS cpu)
  endif()
  molora_add_exit_test(prof_cli_missing_file_exits_2 2 prof summary /no/such/trace.json)
  molora_add_exit_test(prof_cli_no_subcommand_exits_2 2 prof)
  molora_add_exit_test(prof_cli_malformed_exits_3 3
    prof summary ${CMAKE_CURRENT_SOURCE_DIR}/data/prof_malformed.json)
  molora_add_exit_test(prof_cli_truncated_exits_3 3
    prof summary ${CMAKE_CURRENT_SOURCE_DIR}/data/prof_truncated.json)
endif()
