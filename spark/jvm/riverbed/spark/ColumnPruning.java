package riverbed.spark;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.AttributeSet;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2ScanRelation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.internal.connector.SupportsMetadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Column pruning for one Python data source (Riverbed's), which Spark 4.3 does not do itself.
 *
 * <p>Spark's scan builder for Python data sources has no {@code SupportsPushDownRequiredColumns},
 * so {@code V2ScanRelationPushDown} leaves the scan reading every column of the source's schema
 * and puts a {@code Project} (and any {@code Filter}s) on top of it:
 * {@code Project(list, Filter*(DataSourceV2ScanRelation(PythonScan)))}. This rule runs later (in
 * the optimizer's "User Provided Optimizers" batch, where {@code experimental().extraOptimizations}
 * go) and swaps that scan for one whose read schema holds only the columns the Project and the
 * Filters reference. The Python reader is then created with that schema, so it reads only those
 * columns.
 *
 * <p>The scans of one relation in a plan (a self-join, a union) are narrowed together, to the
 * columns any of them needs, and share one new provider: Spark plans the Python reader once per
 * provider, so they still read one snapshot. If one of them needs every column (it is not under a
 * Project), none is narrowed.
 *
 * <p>What it leaves alone: any other source; a scan with filters pushed into Python (the new scan
 * would not carry them). The kept attributes are the scan's own objects, so their exprIds, and
 * the Project's output, are unchanged. If Spark's internals differ from what this was built
 * against, the rule logs once and leaves plans as they are: fewer columns is an optimization,
 * never a requirement.
 */
public final class ColumnPruning extends Rule<LogicalPlan> {
  static final String PYTHON_SCAN = "org.apache.spark.sql.execution.datasources.v2.python.PythonScan";
  static final String PYTHON_TABLE =
      "org.apache.spark.sql.execution.datasources.v2.python.PythonTable";
  // When a query needs no column (count()), a reader still has to yield rows: it reads this one,
  // the cheapest (one value per object, so one dictionary entry and a run-length).
  static final String CHEAPEST_COLUMN = "partition";

  private final String sourceName;
  private volatile boolean warned = false;

  public ColumnPruning(String sourceName) {
    this.sourceName = sourceName;
  }

  @Override
  public String ruleName() {
    return "riverbed.spark.ColumnPruning(" + sourceName + ")";
  }

  @Override
  public LogicalPlan apply(LogicalPlan plan) {
    try {
      // What each of our scans must keep: the references of the Project (and Filters) above
      // it, or null for every column.
      Map<DataSourceV2ScanRelation, AttributeSet> required = new IdentityHashMap<>();
      collectRequired(plan, required);
      if (required.isEmpty()) {
        return plan;
      }
      Map<Table, List<DataSourceV2ScanRelation>> byTable = new IdentityHashMap<>();
      for (DataSourceV2ScanRelation scan : required.keySet()) {
        byTable.computeIfAbsent(scan.relation().table(), t -> new ArrayList<>()).add(scan);
      }
      Map<LogicalPlan, LogicalPlan> replacements = new IdentityHashMap<>();
      for (List<DataSourceV2ScanRelation> scans : byTable.values()) {
        replacements.putAll(narrowed(scans, required));
      }
      return replacements.isEmpty() ? plan : replaced(plan, replacements);
    } catch (RuntimeException | LinkageError error) {
      if (!warned) {
        warned = true;
        log().warn(ruleName() + " is off: this Spark's internals are not those it was built"
            + " for; queries read every column", error);
      }
      return plan;
    }
  }

  private void collectRequired(LogicalPlan plan, Map<DataSourceV2ScanRelation, AttributeSet> out) {
    if (plan instanceof DataSourceV2ScanRelation scan && isOurs(scan)) {
      out.put(scan, null); // reached other than through a Project: its parent may need all
      return;
    }
    if (plan instanceof Project project) {
      AttributeSet references = project.references();
      LogicalPlan node = project.child();
      while (node instanceof Filter filter) {
        references = references.$plus$plus(filter.references());
        node = filter.child();
      }
      if (node instanceof DataSourceV2ScanRelation scan && isOurs(scan)) {
        if (!out.containsKey(scan)) {
          out.put(scan, references);
        } else if (out.get(scan) != null) {
          out.put(scan, out.get(scan).$plus$plus(references)); // the same node twice in a plan
        }
        return;
      }
    }
    for (LogicalPlan child : CollectionConverters.asJava(plan.children())) {
      collectRequired(child, out);
    }
  }

  private boolean isOurs(DataSourceV2ScanRelation relation) {
    Table table = relation.relation().table();
    return relation.scan().getClass().getName().equals(PYTHON_SCAN)
        && table.getClass().getName().equals(PYTHON_TABLE)
        && sourceName.equals(table.name());
  }

  /**
   * New scans for the scans of one relation, reading the columns any of them needs (at least
   * one); none if one of them needs all, or they already read only those.
   */
  private Map<LogicalPlan, LogicalPlan> narrowed(
      List<DataSourceV2ScanRelation> scans, Map<DataSourceV2ScanRelation, AttributeSet> required) {
    StructField[] fields = scans.get(0).scan().readSchema().fields();
    boolean[] keep = new boolean[fields.length];
    for (DataSourceV2ScanRelation scan : scans) {
      List<AttributeReference> output = CollectionConverters.asJava(scan.output());
      if (required.get(scan) == null
          || !noFiltersPushed(scan.scan())
          || !sameFields(scan.scan().readSchema().fields(), fields, output)) {
        return Map.of();
      }
      for (int i = 0; i < fields.length; i++) {
        keep[i] |= required.get(scan).contains(output.get(i));
      }
    }
    List<StructField> kept = new ArrayList<>();
    for (int i = 0; i < fields.length; i++) {
      if (keep[i]) {
        kept.add(fields[i]);
      }
    }
    if (kept.isEmpty()) {
      int cheapest = Math.max(0, indexOf(fields, CHEAPEST_COLUMN));
      keep[cheapest] = true;
      kept.add(fields[cheapest]);
    }
    if (kept.size() == fields.length) {
      return Map.of();
    }
    StructType schema = new StructType(kept.toArray(new StructField[0]));
    // One provider for all: it plans the Python reader once, so they read one snapshot.
    Table table = newTable(schema, scans.get(0).relation().options());
    Map<LogicalPlan, LogicalPlan> replacements = new IdentityHashMap<>();
    for (DataSourceV2ScanRelation scan : scans) {
      CaseInsensitiveStringMap options = scan.relation().options();
      Scan newScan = ((SupportsRead) table).newScanBuilder(options).build();
      if (!newScan.readSchema().equals(schema)) {
        return Map.of();
      }
      List<AttributeReference> output = CollectionConverters.asJava(scan.output());
      List<AttributeReference> keptOutput = new ArrayList<>();
      for (int i = 0; i < fields.length; i++) {
        if (keep[i]) {
          keptOutput.add(output.get(i));
        }
      }
      replacements.put(scan, withScan(scan, newScan, keptOutput));
    }
    return replacements;
  }

  /** Whether a scan reads `fields` (by name, in order) into `output`, as pushdown made it. */
  private static boolean sameFields(
      StructField[] read, StructField[] fields, List<AttributeReference> output) {
    if (read.length != fields.length || output.size() != fields.length) {
      return false;
    }
    for (int i = 0; i < fields.length; i++) {
      if (!read[i].equals(fields[i]) || !fields[i].name().equals(output.get(i).name())) {
        return false;
      }
    }
    return true;
  }

  /**
   * A table of the source with `schema`, from a provider of its own, as a DataFrameReader makes
   * one: the provider caches the Python reader it plans (for the schema it is first asked for),
   * and the original one is shared by every query on the same DataFrame.
   */
  private Table newTable(StructType schema, CaseInsensitiveStringMap options) {
    PythonDataSourceV2 provider = new PythonDataSourceV2();
    provider.setShortName(sourceName);
    return provider.getTable(schema, new Transform[0], options);
  }

  /** `plan` with the nodes that are keys of `replacements` (by identity) replaced. */
  private static LogicalPlan replaced(LogicalPlan plan, Map<LogicalPlan, LogicalPlan> replacements) {
    LogicalPlan replacement = replacements.get(plan);
    if (replacement != null) {
      return replacement;
    }
    return plan.mapChildren(child -> replaced(child, replacements));
  }

  /** Filters the Python reader accepted would be lost by a new scan: only prune without them. */
  private static boolean noFiltersPushed(Scan scan) {
    if (!(scan instanceof SupportsMetadata metadata)) {
      return false;
    }
    scala.Option<String> pushed = metadata.getMetaData().get("PushedFilters");
    return pushed.isDefined() && pushed.get().equals("[]");
  }

  /** A copy of `relation` with another scan and output; its other fields as they were. */
  private static DataSourceV2ScanRelation withScan(
      DataSourceV2ScanRelation relation, Scan scan, List<AttributeReference> output) {
    Object oldScan = relation.scan();
    Object oldOutput = relation.output();
    List<Object> args = new ArrayList<>();
    Set<String> replaced = new HashSet<>();
    scala.collection.Iterator<Object> fields = relation.productIterator();
    while (fields.hasNext()) {
      Object field = fields.next();
      if (field == oldScan) {
        args.add(scan);
        replaced.add("scan");
      } else if (field == oldOutput) {
        args.add(seq(output));
        replaced.add("output");
      } else {
        args.add(field);
      }
    }
    if (replaced.size() != 2) {
      throw new IllegalStateException("DataSourceV2ScanRelation has no scan or output field");
    }
    return (DataSourceV2ScanRelation) relation.makeCopy(args.toArray());
  }

  private static int indexOf(StructField[] fields, String name) {
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  private static <T> scala.collection.immutable.Seq<T> seq(List<T> items) {
    return CollectionConverters.asScala(items).toSeq();
  }
}
